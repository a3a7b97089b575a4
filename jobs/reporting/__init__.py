"""What the report phase (jobs/phases/report.py) draws from a finished run: its plots (plots.py)."""
