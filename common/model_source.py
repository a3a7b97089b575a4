"""One rule for a model string: a local saved-model folder or a hub id.

The trainer, the inference service and pre-staging all take a model as a string
and must agree on what it names, or a model passes one check and is refused by
the next after hours of work. The rule, applied in this order:

1. a folder holding `config.json` (after `~` expansion) is a local model;
2. a string that names a local path is a local model that is not there, which
   is an error naming the path: it starts with `/`, `.` or `~`, or something
   exists at that path (a folder without config.json shadows a hub id of the
   same name, as it does in transformers' `from_pretrained`), or it is not a
   hub id at all (`a/b/c`, `my model`);
3. anything else is a hub id, `name` or `org/name` (`gpt2`,
   `meta-llama/Llama-3.1-8B-Instruct`), for the engine or loader to download.

So a relative folder that does not exist but looks like `org/name` is taken
for a hub id; the download then fails with the hub's own "not found".
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# Hub repository names (huggingface_hub's validate_repo_id): letters, digits, '-', '_', '.',
# starting and ending with a letter, digit or '_', at most 96 characters, optionally behind
# one "org/"; no "--" or "..".
_HUB_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
HUB_ID = re.compile(rf"^(?:{_HUB_PART}/)?{_HUB_PART}\Z")  # \Z: "$" would pass a trailing newline
HUB_ID_CHARS = "name or org/name of letters, digits, '-', '_' and '.'"


class ModelSourceError(FileNotFoundError):
    """The model string names a local path that holds no saved model (or nothing at all)."""


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["local", "hub"]
    path: str  # "local": the folder's absolute path; "hub": the hub id as given

    @property
    def is_local(self) -> bool:
        return self.kind == "local"


def is_hub_id(model: str) -> bool:
    """Whether `model` is shaped like a hub id (`name` or `org/name`); says nothing of the local disk."""
    return bool(HUB_ID.match(model)) and "--" not in model and ".." not in model and not model.endswith(".git")


def model_source(model: str, what: str = "model") -> ModelSource:
    """Classify `model` as a local saved-model folder or a hub id (see the module's rule).

    Raises ModelSourceError (a FileNotFoundError) naming the path when `model`
    names a local path without a saved model; `what` starts the message
    ("base model", "source").
    """
    if not model or not model.strip():
        raise ModelSourceError(f"{what} is empty: give a saved model folder or a hub id ({HUB_ID_CHARS})")
    folder = Path(model).expanduser()
    if (folder / "config.json").is_file():
        return ModelSource("local", str(folder.resolve()))
    shown = folder.absolute()
    if folder.is_dir():
        shadow = f"; this local folder shadows the hub id {model!r}" if is_hub_id(model) else ""
        raise ModelSourceError(f"{what} {model!r}: the folder {shown} has no config.json, so it is not a saved model{shadow}")
    if folder.exists() or folder.is_symlink():
        raise ModelSourceError(f"{what} {model!r}: {shown} is not a folder (a saved model is a folder holding config.json)")
    if model.startswith(("/", ".", "~")):
        raise ModelSourceError(f"{what} {model!r}: {shown} does not exist (a saved model is a folder holding config.json)")
    if not is_hub_id(model):
        raise ModelSourceError(f"{what} {model!r}: no such folder ({shown}, a saved model is a folder holding config.json), and not a hub id ({HUB_ID_CHARS})")
    return ModelSource("hub", model)
