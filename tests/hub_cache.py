"""A hub cache as huggingface_hub leaves it, written by hand for offline tests of pinned revisions."""

import hashlib
import os
from pathlib import Path


def write_snapshot(repo: Path, commit: str, files: dict[str, bytes]) -> None:
    """`files` at `commit` under `repo` (a `models--org--name` or `datasets--org--name` folder):
    content-addressed blobs, and the snapshot's files as relative symlinks to them."""
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
