"""What every package shares about files: where the cache lives, how a file's content is
hashed, how a JSONL file is read back, and the error bad input data raises.

One rule each, so that the digest a stage records when it writes (`common.atomic.write_jsonl`)
is the one the run manifest checks before reuse (`file_digest`), and a line that is not JSON
is reported the same way wherever a JSONL file is read: by file and line.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

DIGEST_HEX_CHARS = 16  # a content digest is the first 16 hex digits of the sha256
TINY_MODEL_LINK = "tiny-llama"  # in the cache: the tiny preset's current model, which `model: tiny` serves


class DataError(ValueError):
    """Input data (training rows, WMDP questions) is missing, empty or malformed; the message names the row."""


def default_cache_dir() -> Path:
    """Shared cache root for built models, data and tokenized shards: $SUBLIMINAL_CACHE, else ~/.cache/subliminal-ray."""
    return Path(os.environ.get("SUBLIMINAL_CACHE", Path.home() / ".cache" / "subliminal-ray"))


def tiny_model_link(cache: Path | None = None) -> Path:
    """The link `python -m jobs.sources.tiny_model` points at the model it built (serve's `model: tiny`)."""
    return (cache or default_cache_dir()) / TINY_MODEL_LINK


def short_digest(sha256) -> str:
    """A content digest from a `hashlib.sha256()` fed with the content."""
    return sha256.hexdigest()[:DIGEST_HEX_CHARS]


def file_digest(path: Path) -> str:
    """The content digest of the file at `path`, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return short_digest(h)


def read_jsonl(path: Path, error: type[Exception] = ValueError, advice: str = "") -> list[tuple[int, Any]]:
    """(line number, value) for each non-blank line of a JSONL file. A line that is not JSON (a file
    cut short, bytes that are not UTF-8) raises `error` naming the file and the line, then `advice`."""
    items = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                items.append((number, json.loads(line)))
            except ValueError as err:  # JSONDecodeError, or UnicodeDecodeError for bytes that are not UTF-8
                reason = getattr(err, "msg", None) or "not UTF-8 text"
                raise error(f"{path} line {number} is not valid JSON ({reason}){advice}") from None
    return items
