"""The run directory's `manifest.json`: which stages finished, from which inputs, with which outputs.

Each stage's entry keeps the inputs it declared (jobs/stages.py: config values by
dotted key, upstream output hashes, derived values) as a flat mapping, their
hash, its outputs and its time. A rerun compares a stage's inputs now with the
recorded ones: equal inputs and outputs still on disk mean "reuse"; otherwise
the differing keys are the reason it runs. There is no whole-directory check:
changing an evaluation setting reruns evaluation, not the teacher.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from common.atomic import write_json

VERSION = 2


class RunDirError(ValueError):
    """The run directory cannot be used as asked."""


def digest(*parts) -> str:
    """A short, stable hash of JSON-able parts."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


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
            shutil.rmtree(run_dir, ignore_errors=True)
        self.data = {"version": VERSION, "stages": {}, "phases": {}}
        if self.path.is_file():
            try:
                recorded = json.loads(self.path.read_text())
            except json.JSONDecodeError as err:
                raise RunDirError(f"{self.path} is not valid JSON ({err.msg}); pass --fresh to start over") from None
            if recorded.get("version") == VERSION:
                self.data = recorded
            # An older manifest's entries cannot say what their stages read: every stage reruns.

    def entry(self, stage: str) -> dict | None:
        return self.data["stages"].get(stage)

    def output(self, stage: str, key: str = "hash"):
        return self.data["stages"][stage]["outputs"][key]

    def record(self, stage: str, inputs: dict, seconds: float, outputs: dict) -> None:
        self.data["stages"][stage] = {
            "inputs": normalised(inputs), "hash": digest(inputs), "seconds": round(seconds, 2),
            "finished": time.time(), "outputs": normalised(outputs),
        }  # fmt: skip
        self.save()

    def record_phase(self, phase: str, seconds: float) -> None:
        self.data["phases"][phase] = round(seconds, 2)
        self.save()

    def save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.path, self.data)

    def timings(self) -> dict:
        """Wall seconds of each phase's latest run (stages of a phase run together)."""
        return dict(self.data["phases"])
