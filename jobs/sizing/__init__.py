"""How a preset meets a cluster: what runs where and how many at once (placement.py), and the
memory each GPU rank needs (memory_plan.py, also a command line; the model's shape and its
activation terms per token in shape.py)."""
