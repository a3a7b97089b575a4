"""What a preset declares, checked at load: the config tree (config.py), its arms, references and
contrasts (arms.py), and the base models they start from (bases.py). No Ray here.

A new arm kind or config key goes here."""
