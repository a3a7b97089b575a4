"""The statistics, free of Ray and of the pipeline: accuracy and its intervals (accuracy.py), the
transfer metrics and their paired tests (transfer_stats.py), the evidence and verdicts of each
comparison (evidence.py), and the LoRA update cosine (weight_space.py, which reads adapters with
torch). Nothing here imports another part of the project.

A new statistic goes here."""
