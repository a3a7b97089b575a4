"""Small helpers that train/, serve/ and jobs/ share; this package imports nothing of the project.

- `common.atomic`: write a file or a folder so that it appears whole or not at all.
- `common.model_source`: one rule for "a local saved-model folder or a hub id".
- `common.config`: the settings models' base (`Settings`), `ConfigError` and the YAML loader that
  train/ (TrainConfig) and jobs/ (the experiment's config) build on.
"""
