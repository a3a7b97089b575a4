"""What the report phase (jobs/phases/report.py) draws on: the report as typed models (schema.py),
its sections read from the evidence (sections.py) and its accuracy tables (accuracy_tables.py),
report.md (markdown.py), the plots, the timeline, and the pairs pooled (pairs.py, forest.py)."""
