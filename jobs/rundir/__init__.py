"""The run directory's machinery, which knows nothing about WMDP: the manifest of finished stages
(manifest.py), the lock one pipeline holds (run_lock.py), and the plan of what to reuse and what
to run (plan.py)."""
