"""Is a run confirmatory? The state of the source a run starts from, and what its report may claim.

A test is confirmatory only when its design was fixed before its data existed: the preset that
declares it was committed, the run used the preset exactly as committed, and no earlier run of the
same design was already reported. So a report says `confirmatory` only when, at the run's start:

- the checkout is a git repository and no tracked file is modified (`source_state`);
- every preset of its `extends` chain is a tracked file of that repository (so, with nothing
  modified, each is exactly as committed at the commit recorded);
- no `--set` was given;
- no earlier run of the same design is in the registry (`results/registry.jsonl`), and no report
  under `results/` already says `confirmatory` for it: the same preset digest (the hash of the
  resolved config as written), or the same config key by key, a key that one of the two lacks read
  at its default, so a key added to the code later does not make an old design new
  (`same_design`); a later run of it says `repeat`.

The registry sees every run, not only the reports someone kept: a run that may claim anything
(confirmatory or repeat) writes its design there before any stage runs (`record_run`), so a
design run many times and kept once is still a repeat the second time. It is a tracked file,
committed with the results; the check for modified files leaves it out (the run that writes it
would otherwise make the next one exploratory). `$SUBLIMINAL_REGISTRY` points it elsewhere (the
test suite does, so its runs never touch the checkout's).

Anything else is `exploratory`, with the reasons listed. The pipeline decides this when it starts,
before any stage runs, and the report records it under `provenance.registration`; MLflow's parent
run carries the same commit and dirty flag (`source_state` is the one reader of both).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from jobs.rundir.manifest import flatten

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
REGISTRY_NAME = "registry.jsonl"  # under results/


def registry_path(results: Path = RESULTS) -> Path:
    """The registry of every registered run's design: $SUBLIMINAL_REGISTRY, else `results`/registry.jsonl."""
    return Path(os.environ.get("SUBLIMINAL_REGISTRY", results / REGISTRY_NAME))


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
    status = _git(
        "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude)results/{REGISTRY_NAME}", cwd=root
    )
    return {
        "commit": head.stdout.strip(),
        "dirty": status is None or status.returncode != 0 or bool(status.stdout.strip()),
    }


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


def earlier_confirmatory(
    preset_digest: str, results: Path = RESULTS, design: dict | None = None, defaults: dict | None = None
) -> Path | None:
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
        stored = registration.get("design") or (
            flatten(provenance["config"]) if isinstance(provenance.get("config"), dict) else None
        )
        if design is not None and stored is not None and same_design(stored, design, defaults or {}):
            return report
    return None


def registered_runs(
    preset_digest: str, registry: Path, design: dict | None = None, defaults: dict | None = None
) -> list[tuple[str, dict]]:
    """Every registry entry of this design (matched as `earlier_confirmatory` matches a report), in
    the order they ran, each with a name for it (its line, start time and commit)."""
    lines = registry.read_text().splitlines() if registry.is_file() else []
    runs = []
    for number, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
        except ValueError:
            raise ValueError(
                f"{registry}, line {number}: not a JSON object; the registry is written one run a line"
            ) from None
        same = entry.get("preset_digest") == preset_digest or (
            design is not None
            and entry.get("design") is not None
            and same_design(entry["design"], design, defaults or {})
        )
        if same:
            runs.append(
                (
                    f"{registry.name} line {number} (started {entry.get('started')}, commit {str(entry.get('commit'))[:12]})",
                    entry,
                )
            )
    return runs


def record_run(claim: dict, registry: Path | None = None) -> None:
    """Append this run's design to the registry, before any stage runs: every later run of it is a
    repeat. One line a run, written under a lock so that runs starting together both land."""
    registry = registry or registry_path()
    entry = {k: claim[k] for k in ("preset_digest", "status", "commit", "chain", "design", "run_dir")}
    entry["started"] = datetime.now(UTC).isoformat(timespec="seconds")
    registry.parent.mkdir(parents=True, exist_ok=True)
    with open(registry, "a") as out:
        fcntl.flock(out, fcntl.LOCK_EX)
        out.write(json.dumps(entry, sort_keys=True) + "\n")


def registration(
    chain: list[Path],
    overrides: list[str],
    preset_digest: str,
    root: Path = REPO,
    results: Path = RESULTS,
    design: dict | None = None,
    defaults: dict | None = None,
    registry: Path | None = None,
    run_dir: Path | None = None,
    fresh: bool = False,
) -> dict:
    """{status: confirmatory | repeat | exploratory, reasons, commit, dirty, preset_digest, design,
    chain, overrides, earlier, run_dir, resumes}: what this run's report may claim (module
    docstring). `design` and `defaults`: the flattened config as written and every key's default
    (`same_design`). `run_dir`: the run's directory; unless `fresh`, a registered run of this design
    in the same directory is the one it resumes (`resumes`), and that run's claim stands."""
    state, reasons = source_state(root), []
    if state["commit"] is None:
        reasons.append("not run from a git checkout: the design it ran cannot be tied to a commit")
    elif state["dirty"]:
        reasons.append("tracked files were modified at the start: the code and presets run are not the commit recorded")
    if state["commit"] is not None and (loose := untracked(chain, root)):
        reasons.append("presets not tracked by the repository: " + ", ".join(str(p) for p in loose))
    if overrides:
        reasons.append("--set given: " + " ".join(overrides))
    earlier = resumes = None
    status = "exploratory" if reasons else "confirmatory"
    runs = [] if reasons else registered_runs(preset_digest, registry or registry_path(results), design, defaults)
    own = [(name, entry) for name, entry in runs if run_dir is not None and entry.get("run_dir") == str(run_dir)]
    if own and not fresh:  # this directory's last registered run, resumed: its claim stands
        resumes, status = own[-1][0], own[-1][1].get("status", "repeat")
    elif runs:
        earlier = runs[0][0]
    elif not reasons and (kept := earlier_confirmatory(preset_digest, results, design, defaults)) is not None:
        earlier = str(kept)
    if earlier is not None:
        status = "repeat"
        reasons.append(f"this design ran before: {earlier}")
    return {
        **state,
        "status": status,
        "reasons": reasons,
        "preset_digest": preset_digest,
        "design": design,
        "chain": [str(p) for p in chain],
        "overrides": list(overrides),
        "earlier": earlier,
        "run_dir": None if run_dir is None else str(run_dir),
        "resumes": resumes,
    }
