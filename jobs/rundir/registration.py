"""Is a run confirmatory? The state of the source a run starts from, and what its report may claim.

A test is confirmatory only when its design was fixed before its data existed: the preset that
declares it was committed, the run used the preset exactly as committed, and no earlier run of the
same design was already reported. So a report says `confirmatory` only when, at the run's start:

- the checkout is a git repository and no tracked file is modified (`source_state`);
- every preset of its `extends` chain is a tracked file of that repository (so, with nothing
  modified, each is exactly as committed at the commit recorded);
- no `--set` was given;
- no report under `results/` already says `confirmatory` for the same design: the same preset
  digest (the hash of the resolved config as written), or the same config key by key, a key that
  one of the two lacks read at its default, so a key added to the code later does not make an
  old design new (`same_design`); a later run of it says `repeat`.

Anything else is `exploratory`, with the reasons listed. The pipeline decides this when it starts,
before any stage runs, and the report records it under `provenance.registration`; MLflow's parent
run carries the same commit and dirty flag (`source_state` is the one reader of both).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from jobs.rundir.manifest import flatten

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"


def _git(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def source_state(root: Path = REPO) -> dict:
    """{commit, dirty}: the checkout's HEAD and whether a tracked file differs from it (untracked
    files do not count); both None outside a git checkout or without git."""
    head = _git("rev-parse", "HEAD", cwd=root)
    if head is None or head.returncode != 0:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=root)
    return {"commit": head.stdout.strip(), "dirty": status is None or status.returncode != 0 or bool(status.stdout.strip())}


def untracked(paths: list[Path], root: Path = REPO) -> list[Path]:
    """The paths that are not files tracked by the repository at `root`."""
    out = []
    for path in paths:
        done = _git("ls-files", "--error-unmatch", str(Path(path).resolve()), cwd=root)
        if done is None or done.returncode != 0:
            out.append(Path(path))
    return out


def same_design(stored: dict, now: dict, defaults: dict) -> bool:
    """Two flattened configs ask for the same run: every key equal, a key one of them lacks read at
    its default (a key added to the code since a run keeps that run's design, unless it is set)."""
    return all(stored.get(k, defaults.get(k)) == now.get(k, defaults.get(k)) for k in stored.keys() | now.keys())


def earlier_confirmatory(preset_digest: str, results: Path = RESULTS, design: dict | None = None, defaults: dict | None = None) -> Path | None:
    """The first report under `results` that says confirmatory for this design, if any: the same
    preset digest, or, given the flattened `design` and `defaults`, a stored design (its
    registration's, else its provenance's config) that `same_design` matches."""
    for report in sorted(results.glob("**/report.json")) if results.is_dir() else []:
        try:
            provenance = json.loads(report.read_text())["provenance"]
            registration = provenance["registration"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if registration.get("status") != "confirmatory":
            continue
        if registration.get("preset_digest") == preset_digest:
            return report
        stored = registration.get("design") or (flatten(provenance["config"]) if isinstance(provenance.get("config"), dict) else None)
        if design is not None and stored is not None and same_design(stored, design, defaults or {}):
            return report
    return None


def registration(
    chain: list[Path],
    overrides: list[str],
    preset_digest: str,
    root: Path = REPO,
    results: Path = RESULTS,
    design: dict | None = None,
    defaults: dict | None = None,
) -> dict:
    """{status: confirmatory | repeat | exploratory, reasons, commit, dirty, preset_digest, design,
    chain, overrides, earlier}: what this run's report may claim (module docstring). `design` and
    `defaults`: the flattened config as written and every key's default (`same_design`)."""
    state, reasons = source_state(root), []
    if state["commit"] is None:
        reasons.append("not run from a git checkout: the design it ran cannot be tied to a commit")
    elif state["dirty"]:
        reasons.append("tracked files were modified at the start: the code and presets run are not the commit recorded")
    if state["commit"] is not None and (loose := untracked(chain, root)):
        reasons.append("presets not tracked by the repository: " + ", ".join(str(p) for p in loose))
    if overrides:
        reasons.append("--set given: " + " ".join(overrides))
    earlier = None if reasons else earlier_confirmatory(preset_digest, results, design, defaults)
    status = "exploratory" if reasons else ("repeat" if earlier else "confirmatory")
    if earlier is not None:
        reasons.append(
            f"the first confirmatory run of this design is {earlier.relative_to(results.parent) if earlier.is_relative_to(results.parent) else earlier}"
        )
    return {
        **state, "status": status, "reasons": reasons, "preset_digest": preset_digest, "design": design,
        "chain": [str(p) for p in chain], "overrides": list(overrides), "earlier": None if earlier is None else str(earlier),
    }  # fmt: skip
