"""Where the experiment's inputs come from: WMDP questions (wmdp.py), the number-sequence prompts
and filter (number_sequences.py), and the tiny preset's model, built locally (tiny_model.py).

A new data source goes here."""
