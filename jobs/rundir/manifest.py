"""The run directory's `manifest.json`: which stages finished, from which inputs, with which outputs.

Each stage's entry keeps the inputs it declared (jobs/rundir/plan.py: config values by
dotted key, upstream output hashes, derived values) as a flat mapping, their
hash, its outputs and its time. A rerun compares a stage's inputs now with the
recorded ones: equal inputs and outputs still on disk, as they were written,
mean "reuse"; otherwise the differing keys are the reason it runs. There is no
whole-directory check: changing an evaluation setting reruns evaluation, not
the teacher.

Each entry also keeps the digest of every file the stage wrote (`files`:
path relative to the run directory -> digest; a folder, such as an adapter,
counts as the files under it). Before reuse each one is hashed again, so a file
cut short by a copy, overwritten, or lost reruns its stage instead of being
read by the next one (`changed_output`). That reads every output once per run
(hundreds of MB per adapter on a 70B model: seconds to minutes per run, once;
later plans in the same process reuse the digest of a file whose inode, size
and mtime have not changed). Entries recorded before digests were kept have no
`files` and are checked for existence only.

A manifest that is not JSON, or not the shape this version writes, is a
RunDirError naming it: nothing is guessed from a damaged record.

A stage's outputs are a typed record (`Outputs`: one model per kind of stage, which the experiment
declares) written in its plain form, the keys on disk; `Manifest.outputs` reads one back as its
type.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from common.atomic import TMP_MARK, write_json
from common.files import file_digest
from common.files import read_jsonl as numbered_jsonl

VERSION = 2
LOCK_FILE = ".lock"  # jobs/rundir/run_lock.py holds it while a pipeline uses the run directory; --fresh keeps it


class RunDirError(ValueError):
    """The run directory cannot be used as asked."""


class Outputs(BaseModel):
    """What a kind of stage records as its outputs: a frozen model whose fields are the record's keys
    on disk, in their order. Each kind declares a `hash` (the digest of what it made: what a
    downstream stage reads as its input) where its records have always had it. A name that is not
    a field is refused when a record is made; one in a stored record is left out when it is read
    (written by a version before, read by nothing now)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    OMIT_NONE: ClassVar[tuple[str, ...]] = ()  # keys on disk only when set

    def plain(self) -> dict:
        """The record as the manifest keeps it."""
        return {k: v for k, v in self.model_dump(mode="json").items() if not (k in self.OMIT_NONE and v is None)}

    @classmethod
    def from_plain(cls, data: dict):
        """A record as stored (see the class docstring for keys it does not know)."""
        return cls.model_validate({k: v for k, v in data.items() if k in cls.model_fields})


class Hashed(Outputs):
    """The record of a stage whose outputs are its files alone (the report): their digest."""

    hash: str


Record = TypeVar("Record", bound=Outputs)


def digest(*parts) -> str:
    """A short, stable hash of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_jsonl(path: Path) -> list:
    """The rows of a JSONL file a stage wrote, one JSON value per line.

    A line that is not JSON (a file cut short by a copy or a full disk) is a
    RunDirError naming the file and the line, not a traceback. The plan catches
    a damaged output before it is read (its digest differs); this covers files
    recorded without digests and a file damaged while the run reads it.
    """
    advice = ": the file is damaged; delete it to rerun the stage that wrote it, or pass --fresh"
    return [row for _, row in numbered_jsonl(path, RunDirError, advice)]


def clear(run_dir: Path) -> None:
    """Delete everything in `run_dir` but its lock file (--fresh): the pipeline holding the lock keeps it,
    so a second pipeline still finds the directory taken."""
    if not run_dir.is_dir():
        return
    for child in run_dir.iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def shape_problem(data) -> str | None:
    """What is wrong with a manifest of this version as read from disk, or None when it has the shape
    `Manifest` writes (the keys the plan and the stages read)."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key in ("stages", "phases"):
        if not isinstance(data.get(key), dict):
            return f"{key!r} is missing or not an object"
    for name, entry in data["stages"].items():
        if not isinstance(entry, dict):
            return f"stage {name!r} is not an object"
        for key in ("inputs", "outputs"):
            if not isinstance(entry.get(key), dict):
                return f"stage {name!r}: {key!r} is missing or not an object"
        if "hash" not in entry["outputs"]:
            return f"stage {name!r}: its outputs have no 'hash'"
        files = entry.get("files", {})
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            return f"stage {name!r}: 'files' is not an object of digests"
        outside = next((rel for rel in files if not stays_inside(rel)), None)
        if outside is not None:
            return f"stage {name!r}: file {outside[:200]!r} is not a path inside the run directory"
    return None


def stays_inside(rel: str) -> bool:
    """A relative path with no `..`: the manifest names only files of its own run directory."""
    path = PurePosixPath(rel)
    return bool(rel) and not path.is_absolute() and ".." not in path.parts


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def normalised(data):
    """What a value looks like after a JSON round trip (tuples become lists), so comparisons hold."""
    return json.loads(json.dumps(data, default=str))


class Manifest:
    def __init__(self, run_dir: Path, fresh: bool = False):
        self.run_dir, self.path = run_dir, run_dir / "manifest.json"
        if fresh:
            clear(run_dir)
        self.data = {"version": VERSION, "stages": {}, "phases": {}}
        self._digests: dict[Path, tuple[tuple, str]] = {}  # path -> (its stat when hashed, digest)
        if self.path.is_file():
            try:
                recorded = json.loads(self.path.read_bytes())
            except json.JSONDecodeError as err:
                raise RunDirError(f"{self.path} is not valid JSON ({err.msg}); pass --fresh to start over") from None
            except (OSError, UnicodeDecodeError) as err:
                raise RunDirError(f"{self.path} cannot be read ({err}); pass --fresh to start over") from None
            if not isinstance(recorded, dict) or recorded.get("version") == VERSION:
                problem = shape_problem(recorded)
                if problem:
                    raise RunDirError(f"{self.path} is not a run manifest: {problem}; pass --fresh to start over")
                self.data = recorded
            # An older manifest's entries cannot say what their stages read: every stage reruns.

    def entry(self, stage: str) -> dict | None:
        return self.data["stages"].get(stage)

    def output(self, stage: str, key: str = "hash"):
        return self.data["stages"][stage]["outputs"][key]

    def outputs(self, stage: str, kind: type[Record]) -> Record:
        """A finished stage's outputs record, read as `kind`; a RunDirError when it is not one."""
        try:
            return kind.from_plain(self.data["stages"][stage]["outputs"])
        except ValidationError as err:
            problem = f"{err.errors()[0]['loc']}: {err.errors()[0]['msg']}"
            raise RunDirError(
                f"{self.path}: stage {stage!r} did not record {kind.__name__} outputs ({problem}); pass --fresh to start over"
            ) from None

    def record(self, stage: str, inputs: dict, seconds: float, outputs: dict, files=()) -> None:
        """Record `stage` as finished; `files` are the outputs it wrote (paths relative to the run
        directory, files or folders), whose digests a later plan checks before reusing them."""
        self.data["stages"][stage] = {
            "inputs": normalised(inputs),
            "hash": digest(inputs),
            "seconds": round(seconds, 2),
            "finished": time.time(),
            "outputs": normalised(outputs),
            "files": self.file_digests(files),
        }
        self.save()

    def restate(self, inputs: dict[str, dict]) -> None:
        """Record finished stages' inputs as read now ({stage: inputs}; plan.restate); outputs stay."""
        for stage, values in inputs.items():
            self.data["stages"][stage].update(inputs=normalised(values), hash=digest(values))
        if inputs:
            self.save()

    def file_digests(self, paths) -> dict[str, str]:
        """{relative path: digest} of every file at or under `paths` (relative to the run directory);
        a temporary of an unfinished write (common/atomic.py) is not an output."""
        found = []
        for rel in paths:
            path = self.run_dir / rel
            if path.is_dir():
                found += sorted(p for p in path.rglob("*") if p.is_file() and TMP_MARK not in p.name)
            else:
                found.append(path)  # a missing one raises: a stage recorded without its output is a bug
        return {p.relative_to(self.run_dir).as_posix(): self._digest(p) for p in found}

    def changed_output(self, stage: str) -> str | None:
        """Why a finished stage's output files cannot be reused: the first one missing, unreadable, or
        not as it was written; None when every recorded file is as written."""
        root = self.run_dir.resolve()
        for rel, recorded in self.entry(stage).get("files", {}).items():
            if not (self.run_dir / rel).resolve().is_relative_to(root):
                return f"output {rel} leads out of the run directory (a symbolic link)"
            try:
                now = self._digest(self.run_dir / rel)
            except FileNotFoundError:
                return f"output {rel} is missing"
            except OSError as err:
                return f"output {rel} cannot be read ({err.strerror or err})"
            if now != recorded:
                return f"output {rel} changed since it was written"
        return None

    def _digest(self, path: Path) -> str:
        """file_digest(path), hashed once per version of the file in this process (its stat as the key)."""
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._digests.get(path)
        if cached is None or cached[0] != key:
            cached = self._digests[path] = (key, file_digest(path))
        return cached[1]

    def record_phase(self, phase: str, seconds: float, started: float | None = None, spans: list[dict] = ()) -> None:
        """A phase's wall seconds (`timings`) and, when `started` is given, its spans as it ran."""
        self.data["phases"][phase] = round(seconds, 2)
        if started is not None:
            self.record_spans(phase, started, seconds, spans)
        self.save()

    def record_spans(self, name: str, started: float, seconds: float, spans: list[dict]) -> None:
        """What a phase (or the driver's `start`, before the first phase) did while it ran: the run's
        timeline (jobs/reporting/timeline.py). The latest run of each replaces the one before."""
        self.data.setdefault("spans", {})[name] = {
            "started": started,
            "seconds": round(seconds, 2),
            "spans": list(spans),
        }

    def phase_spans(self) -> dict:
        """{phase: {started, seconds, spans}} as recorded by the latest run of each phase."""
        return dict(self.data.get("spans", {}))

    def save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.path, self.data)

    def timings(self) -> dict:
        """Wall seconds of each phase's latest run (stages of a phase run together)."""
        return dict(self.data["phases"])
