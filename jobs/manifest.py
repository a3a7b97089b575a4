"""The run directory's `manifest.json`: which stages finished, from which inputs, in how long.

A stage is skipped on a rerun when the manifest records it finished with the
same inputs hash (its settings plus the hashes of what it reads). A run
directory made with a different configuration is refused, naming the keys
that differ, unless the user starts over with `--fresh`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path


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


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def write_json(path: Path, data) -> None:
    """Write atomically: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(path)


class Manifest:
    def __init__(self, run_dir: Path, config: dict, fresh: bool = False):
        self.path = run_dir / "manifest.json"
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.path.is_file():
            self.data = json.loads(self.path.read_text())
            before, now = _flatten(self.data["config"]), _flatten(json.loads(json.dumps(config, default=str)))
            differing = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
            if differing:
                raise RunDirError(
                    f"{run_dir} holds a run made with a different config (differs in {', '.join(differing[:8])}); "
                    "pass --fresh to start over there, or choose another --run-dir"
                )
        else:
            self.data = {"config": config, "stages": {}}
            write_json(self.path, self.data)

    def finished(self, stage: str, inputs: str) -> dict | None:
        """The stage's recorded entry if it finished with these inputs, else None."""
        entry = self.data["stages"].get(stage)
        return entry if entry and entry["inputs"] == inputs else None

    def record(self, stage: str, inputs: str, seconds: float, outputs: dict) -> None:
        self.data["stages"][stage] = {"inputs": inputs, "seconds": round(seconds, 2), "finished": time.time(), "outputs": outputs}
        write_json(self.path, self.data)

    def timings(self) -> dict:
        return {stage: entry["seconds"] for stage, entry in self.data["stages"].items()}
