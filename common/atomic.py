"""Write files and folders so that they appear whole or not at all.

Everything a later step trusts to be finished (the run manifest, a data split,
a tokenized cache entry, a saved model, a trained adapter, a staged copy of
weights) is written under a temporary name beside its destination and renamed
into place once complete. A rename within one folder is atomic on POSIX file
systems, so:

- a reader (the next stage, a resumed run, another node on shared storage)
  never sees half a file: it sees the old version or the new one;
- a crash (an exception, a killed Ray worker, Ctrl-C) never leaves a partial
  artifact under the real name, where a rerun would take it for finished.

Temporary names are `.<name>.tmp-<random>` in the destination's folder: hidden,
unique per writer (two processes writing one destination never share a
temporary; the last rename wins, and each version is whole), and never matched
by a glob on the real suffix (`*.jsonl`, `*.parquet`). A temporary is removed
when the write fails; only a process killed outright (SIGKILL, power loss)
can leave one behind, and it never looks finished.

The whole-file writers (`write_text`, `write_json`, `write_jsonl`) also fsync
the file before the rename, so after a power loss the destination holds the old
content or the new one, not an empty file. `atomic_file` and `atomic_dir` leave
syncing to the caller, who writes through its own handles (a model's weights,
a parquet dataset).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from common.files import short_digest

TMP_MARK = ".tmp-"  # in every temporary's name


def temporary_beside(target: str | os.PathLike) -> Path:
    """A fresh, unused name for a temporary in `target`'s folder (same file system, so the rename is atomic)."""
    target = Path(target)
    return target.with_name(f".{target.name}{TMP_MARK}{uuid.uuid4().hex[:12]}")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path` for the caller to write; rename it to `path` on success.

    On success the temporary replaces `path` (an old file there is replaced in one
    step); on any exception it is removed and `path` is untouched. Parent folders
    are created. The temporary's name does not end in `path`'s suffix, so a writer
    that infers the format from the name needs it given (`savefig(tmp, format="png")`).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_beside(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists() or tmp.is_symlink():
            _remove(tmp)


def _write_chunks(path: str | os.PathLike, chunks: Iterable[bytes]) -> str:
    """Write `chunks` to `path` atomically (fsynced); returns the content digest of the bytes written."""
    digest = hashlib.sha256()
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                digest.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
    return short_digest(digest)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically: a reader sees the old content or all of the new, never part."""
    _write_chunks(path, [text.encode("utf-8")])


def write_json(path: str | os.PathLike, data, *, indent: int | None = 2) -> None:
    """Write `data` as JSON to `path` atomically. Values JSON cannot hold (paths, dates) are written as str."""
    write_text(path, json.dumps(data, indent=indent, default=str) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable) -> str:
    """Write one JSON object per line to `path` atomically; returns the file's hash.

    `rows` may be a generator: lines are streamed to the temporary, never held
    in memory together. The hash is the file's content digest, as
    `common.files.file_digest(path)` computes it afterwards, so a stage can record
    what it wrote without reading it back.
    """
    return _write_chunks(path, ((json.dumps(row) + "\n").encode("utf-8") for row in rows))


@contextmanager
def atomic_dir(target: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Yield a new, empty temporary folder beside `target`; rename it to `target` only on success.

    Fill the folder inside the `with` block (`save_pretrained(tmp)`,
    `write_parquet(tmp)`, `shutil.copytree(src, tmp, dirs_exist_ok=True)`). When
    the block raises, the temporary is removed and `target` is untouched, so a
    crash never leaves a partial folder that looks finished. Parent folders are
    created.

    At the rename, an empty folder at `target` is replaced. A non-empty one is
    replaced only with `replace=True` (moved aside, the new folder renamed in,
    then the old one removed: readers see the old folder or the new one, or for
    an instant none); otherwise the rename raises FileExistsError, which is how
    a writer learns that another one finished the same target first.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_beside(target)
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if replace and (target.is_symlink() or (target.exists() and not _is_empty_dir(target))):
            old = temporary_beside(target)
            os.rename(target, old)
        try:
            os.rename(tmp, target)
        except OSError as err:
            if old is not None:
                os.rename(old, target)  # put the old one back; the new one is removed below
                old = None
            if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise FileExistsError(errno.EEXIST, f"{target} already exists (not replaced)", str(target)) from err
            raise
        if old is not None:
            _remove(old)
    finally:
        if tmp.exists():
            _remove(tmp)


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def build_once(out: Path, is_built: Callable[[], bool], build: Callable[[], None]) -> None:
    """`build()` unless `is_built()`. Concurrent callers (processes, nodes on shared storage)
    take turns under an exclusive lock file beside `out` and check again once they hold it, so
    one builds and the others find it built."""
    if is_built():
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_name(f".{out.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_built():
            build()
