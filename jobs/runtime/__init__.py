"""What the phases share while they run: the context each is handed (context.py), the Ray Train
run set-up (training_runs.py), a Serve application for a phase (service.py), the wait for the GPUs
the last stage held (handoff.py), the probe that the service applies each adapter
(adapter_check.py) and short progress lines (progress.py)."""
