"""A kept run's report built again from its per-question scores: every kept figure can be re-derived.

A kept run (`results/<preset>/<date>-<commit>/`, `python bench/verdict_tables.py --keep RUN_DIR`)
holds report.json, report.md and `scores.tar.gz`: the run's per-question scores (every
`eval/*.jsonl`, each scored model's and snapshot's) and its manifest.json (what each stage
recorded: steps, losses, rows, numbers made, timings). `rebuild` unpacks them into a scratch run
directory and builds the report with the report phase's own code (jobs/phases/report.build_report)
from the kept report's resolved config and its weight readings: the adapters are not kept, so
those come from the run, as the numbers and timings do (through the manifest). The rebuilt report
carries the kept one's `provenance` (the run's packages, machine and registration, not the
rebuilder's).

`differences` lists every field the kept report holds that the rebuilt one does not hold equally
(floats equal up to rounding). Fields the kept report lacks (added to the report since it was
made) are new readings, not differences. So a change to the statistics that moves a kept figure
shows here, and a new analysis of a kept run needs no rerun: `--json` writes the rebuilt report.

    python -m jobs.rebuild results/tiny/2026-11-29-abc1234            # rebuilt and compared: exit 1 on a difference
    python -m jobs.rebuild results/tiny/2026-11-29-abc1234 --json out.json
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import re
import sys
import tarfile
import tempfile
from pathlib import Path

from common.atomic import write_text
from common.config import build
from jobs.experiment.arms import OTHER_BASE, arm_models
from jobs.experiment.config import ExperimentConfig
from jobs.phases.report import build_report
from jobs.reporting.schema import Report
from jobs.rundir.manifest import Manifest

SCORES = "scores.tar.gz"
# what a scores archive may hold, and nothing above its folder
MEMBER = re.compile(r"(manifest\.json|eval/[\w.@/-]+\.jsonl)")


def pack_scores(run_dir: Path, folder: Path) -> Path:
    """`folder`/scores.tar.gz: `run_dir`'s eval/*.jsonl and manifest.json, byte for byte the same
    archive for the same files (sorted, no times, no owners)."""
    names = ["manifest.json", *sorted(str(p.relative_to(run_dir)) for p in (run_dir / "eval").rglob("*.jsonl"))]
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0) as packed,
        tarfile.open(fileobj=packed, mode="w") as tar,
    ):
        for name in names:
            data = (run_dir / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    (folder / SCORES).write_bytes(buffer.getvalue())
    return folder / SCORES


def unpack_scores(folder: Path, run_dir: Path) -> None:
    """A kept run's scores.tar.gz into `run_dir`; a member that is not a manifest or a scores file
    (a link, a path outside, anything else) is an error naming it, and nothing is written."""
    archive = folder / SCORES
    if not archive.is_file():
        raise FileNotFoundError(
            f"{archive}: this kept run has no per-question scores (kept before they were kept, or by hand)"
        )
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
        wrong = [m.name for m in members if not (m.isfile() and MEMBER.fullmatch(m.name) and ".." not in m.name)]
        if wrong:
            raise ValueError(f"{archive}: not a scores archive: {', '.join(wrong[:5])}")
        for m in members:
            (run_dir / m.name).parent.mkdir(parents=True, exist_ok=True)
            (run_dir / m.name).write_bytes(tar.extractfile(m).read())


def weight_readings(report: Report) -> dict:
    """Each trained LoRA model's {cosine, shares} as the kept report gives them (the report phase
    reads them from the adapters, which a kept run does not hold)."""
    return {
        r.model: {"cosine": r.update_cosine, "shares": r.update_share}
        for arm in report.arms.values()
        if arm.method != "full"
        for r in arm.replicates
    }


def rebuild(folder: Path) -> Report:
    """The kept run in `folder` reported again from its scores (module docstring)."""
    kept = Report.load(folder / "report.json")
    provenance = kept.provenance
    cfg = build(ExperimentConfig, provenance.config)
    paths = {"base": provenance.model_path} | (
        {OTHER_BASE: provenance.other_base_path} if provenance.other_base_path else {}
    )
    with tempfile.TemporaryDirectory(prefix="rebuild-") as scratch:
        run_dir = Path(scratch)
        unpack_scores(folder, run_dir)
        rebuilt = build_report(run_dir, cfg, arm_models(cfg), Manifest(run_dir), paths, weights=weight_readings(kept))
    return rebuilt.with_(provenance=provenance)  # the run's, not the rebuilder's packages and machine


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def differences(kept, rebuilt, path: str = "") -> list[str]:
    """Every field of `kept` (report.json's content) that `rebuilt` does not hold equally, by its path."""
    if isinstance(kept, dict) and isinstance(rebuilt, dict):
        out = []
        for key, value in kept.items():
            where = f"{path}.{key}" if path else key
            out += (
                differences(value, rebuilt[key], where) if key in rebuilt else [f"{where}: not in the rebuilt report"]
            )
        return out
    if isinstance(kept, list) and isinstance(rebuilt, list) and len(kept) == len(rebuilt):
        return [d for i, (k, r) in enumerate(zip(kept, rebuilt)) for d in differences(k, r, f"{path}[{i}]")]
    return [] if _same(kept, rebuilt) else [f"{path}: kept {kept!r}, rebuilt {rebuilt!r}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kept", type=Path, help="a kept run: results/<preset>/<date>-<commit>")
    parser.add_argument("--json", type=Path, help="write the rebuilt report.json here")
    args = parser.parse_args(argv)
    try:
        rebuilt = rebuild(args.kept)
    except (FileNotFoundError, ValueError) as err:
        print(f"rebuild: {err}", file=sys.stderr)
        return 2
    content = json.loads(json.dumps(rebuilt.dump(), default=str))
    if args.json:
        write_text(args.json, json.dumps(content, indent=1))
    found = differences(json.loads((args.kept / "report.json").read_text()), content)
    for line in found[:50]:
        print(line)
    print(f"{args.kept}: {'rebuilt equal to the kept report' if not found else f'{len(found)} field(s) differ'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
