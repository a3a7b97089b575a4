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
   `meta-llama/Llama-3.1-8B-Instruct`), for the engine or loader to download,
   optionally pinned to one commit: `org/name@<40-hex commit>` (the hub's own
   spelling of a repository at a revision, as in its `hf://org/name@rev` paths).

So a relative folder that does not exist but looks like `org/name` is taken
for a hub id; the download then fails with the hub's own "not found".

A pinned hub id travels as that one string (the experiment's `model.revision`
and `arms.<name>.base_revision` make it: jobs/experiment/bases.py), and every
reader opens it with `load_pretrained`, which passes the commit as `revision`
(vLLM: `revision` and `tokenizer_revision`, serve/vllm_engine.py). Why not
resolve it once to a snapshot folder and hand readers that folder: the folder
would exist only on the nodes staged at the start, while training workers and
replicas also run on nodes the autoscaler adds later and the driver (often a
CPU-only head) reads the tokenizer too; with the commit in the string each
process fetches exactly that commit on its own node, as an unpinned hub id is
fetched today. A reader that forgot to split the pin fails loudly (an `@` is
no hub id), rather than reading the newest revision.
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
COMMIT = re.compile(r"[0-9a-f]{40}\Z")  # a full commit hash: the one revision that cannot move


class ModelSourceError(FileNotFoundError):
    """The model string names a local path that holds no saved model (or nothing at all)."""


@dataclass(frozen=True)
class ModelSource:
    kind: Literal["local", "hub"]
    path: str  # "local": the folder's absolute path; "hub": the hub id as given (with its `@commit` when pinned)

    @property
    def is_local(self) -> bool:
        return self.kind == "local"


def is_hub_id(model: str) -> bool:
    """Whether `model` is shaped like a hub id (`name` or `org/name`); says nothing of the local disk."""
    return bool(HUB_ID.match(model)) and "--" not in model and ".." not in model and not model.endswith(".git")


def is_commit(revision: str) -> bool:
    """Whether `revision` is a full 40-character commit hash (a branch or tag name can move)."""
    return bool(COMMIT.match(revision))


def pinned(model: str, revision: str | None) -> str:
    """The one string a reader gets for `model` at `revision`: `org/name@<commit>`, or `model`
    itself when no revision is set."""
    return f"{model}@{revision}" if revision else model


def hub_args(model: str) -> tuple[str, dict]:
    """(name or path, keyword arguments) for a hub reader: a pinned hub id split into the id and
    `revision`; anything else as it is, with none."""
    name, at, revision = model.rpartition("@")
    if at and is_hub_id(name) and is_commit(revision) and not Path(model).expanduser().exists():
        return name, {"revision": revision}
    return model, {}


def load_pretrained(loader, model: str, **kwargs):
    """`loader.from_pretrained(model, **kwargs)` (a transformers Auto class or model class), a pinned
    hub id read at its commit. A loaded model's `name_or_path` keeps the pin, so a later read of the
    same model from it (a fully fine-tuned model's tokenizer, train/model.py) reads the same commit."""
    name, pin = hub_args(model)
    loaded = loader.from_pretrained(name, **pin, **kwargs)
    if pin and hasattr(loaded, "config"):
        loaded.name_or_path = loaded.config.name_or_path = model
    return loaded


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
        raise ModelSourceError(
            f"{what} {model!r}: the folder {shown} has no config.json, so it is not a saved model{shadow}"
        )
    if folder.exists() or folder.is_symlink():
        raise ModelSourceError(
            f"{what} {model!r}: {shown} is not a folder (a saved model is a folder holding config.json)"
        )
    if model.startswith(("/", ".", "~")):
        raise ModelSourceError(
            f"{what} {model!r}: {shown} does not exist (a saved model is a folder holding config.json)"
        )
    name, at, revision = model.rpartition("@")
    if at and is_hub_id(name):
        if not is_commit(revision):
            raise ModelSourceError(
                f"{what} {model!r}: {revision!r} is not a commit; a pinned hub id is {name}@<the full 40-character commit hash>"
            )
        return ModelSource("hub", model)
    if not is_hub_id(model):
        raise ModelSourceError(
            f"{what} {model!r}: no such folder ({shown}, a saved model is a folder holding config.json), and not a hub id ({HUB_ID_CHARS})"
        )
    return ModelSource("hub", model)
