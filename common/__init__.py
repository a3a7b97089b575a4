"""Small helpers that train/, serve/ and jobs/ share; this package imports nothing of the project.

- `common.atomic`: write a file or a folder so that it appears whole or not at all.
- `common.model_source`: one rule for "a local saved-model folder or a hub id".
"""
