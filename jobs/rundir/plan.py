"""The experiment's stage graph: what each stage reads, declared once, and what must run.

A stage declares its inputs: the config values it reads (by dotted key), the
upstream stages whose outputs it reads, and values derived from those outputs
(`derived`, e.g. how many kept sequences every arm of a replicate trains on).
Its inputs are those values, with each upstream stage's output hash; the
manifest keeps them. So a change reruns exactly what depends on it:

- a stage whose recorded inputs equal its inputs now, with its outputs on disk as it wrote
  them, is reused. Inputs compare key by key over what the stage reads now: a key the record
  lacks (a setting added to the code after the stage ran) is read at its default
  (`Stage.defaults`), and a recorded key the stage no longer reads is not compared. So adding a
  setting, or declaring that one only paces work, reruns nothing stored; `restate` then
  records the inputs as read now;
- a stage whose upstream runs, runs;
- otherwise the keys that differ are the reason it runs ("evaluate.primary_split: 'held_out' -> 'train'"),
  or the output file that is missing or damaged ("numbers/teacher/0.jsonl changed since it
  was written"): a damaged file is made again, never read by the next stage.

`plan` walks the stages in order and says, for each, "reuse" or "run" and why;
the pipeline prints it before any work (and `--plan` prints only that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from jobs.rundir.manifest import Hashed, Manifest, Outputs, flatten, normalised


@dataclass(frozen=True)
class Stage:
    name: str  # "data", "teacher", "numbers/teacher/0", "student/0", "eval/student/0", "report"
    phase: str  # stages of one phase run together (one service, one set of training runs)
    reads: dict  # flat: dotted config key (or derived name) -> value
    upstream: tuple[str, ...] = ()
    derived: Callable[[Manifest], dict] | None = field(default=None, compare=False)  # from upstream outputs
    files: tuple[str, ...] = ()  # outputs, relative to the run directory, that reuse needs on disk
    defaults: dict = field(default_factory=dict, compare=False)  # a read key -> its value when unset
    record: type[Outputs] = field(default=Hashed, compare=False)  # the kind of outputs record it writes

    def inputs(self, manifest: Manifest) -> dict:
        """Everything this stage reads, upstream outputs included (they must have finished)."""
        values = dict(self.reads)
        values.update({f"upstream {u}": manifest.output(u) for u in self.upstream})
        if self.derived:
            values.update(self.derived(manifest))
        return normalised(values)


def config_reads(config: dict, *keys: str) -> dict:
    """The named sections or keys of the config (as a dict), flattened to dotted keys."""
    flat = flatten(config)
    picked = {}
    for key in keys:
        hits = {k: v for k, v in flat.items() if k == key or k.startswith(key + ".")}
        if not hits:
            raise KeyError(f"stage reads config key {key!r}, which the config does not have")
        picked.update(hits)
    return picked


MISSING = object()  # a key neither recorded nor defaulted: equal to no value


def _recorded(before: dict, key: str, defaults: dict):
    """A key's recorded value; for a key the record lacks, its default (normalised as inputs are)."""
    if key in before:
        return before[key]
    return normalised(defaults[key]) if key in defaults else MISSING


def differing(before: dict, now: dict, defaults: dict) -> list[str]:
    """The keys read now whose recorded value (or default, where unrecorded) is not their value now."""
    return sorted(k for k, v in now.items() if _recorded(before, k, defaults) != v)


def _changes(before: dict, now: dict, defaults: dict, limit: int = 3) -> str:
    keys = differing(before, now, defaults)
    parts = []
    for key in keys[:limit]:
        if key.startswith("upstream "):
            parts.append(f"{key[len('upstream ') :]} output changed")
        else:
            parts.append(f"{key}: {before.get(key, '(none)')!r} -> {now[key]!r}")
    return "; ".join(parts) + (f"; and {len(keys) - limit} more" if len(keys) > limit else "")


def _names(names: list[str], limit: int = 3) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def decide(stage: Stage, manifest: Manifest, running: set[str]) -> tuple[bool, str]:
    """(run?, reason) for one stage, given the stages already known to run."""
    rerun = [u for u in stage.upstream if u in running]
    if rerun:
        return True, f"upstream {_names(rerun)} runs"
    missing = [u for u in stage.upstream if manifest.entry(u) is None]
    if missing:
        return True, f"upstream {_names(missing)} has not finished"
    entry = manifest.entry(stage.name)
    if entry is None:
        return True, "not run before"
    now = stage.inputs(manifest)
    if differing(entry["inputs"], now, stage.defaults):
        return True, _changes(entry["inputs"], now, stage.defaults)
    gone = [f for f in stage.files if not (manifest.run_dir / f).exists()]
    if gone:
        return True, f"output {gone[0]} is missing"
    damaged = manifest.changed_output(stage.name)  # hashes its files (once per run: jobs/rundir/manifest.py)
    if damaged:
        return True, damaged
    return False, "same inputs"


def plan(stages: list[Stage], manifest: Manifest) -> list[tuple[Stage, bool, str]]:
    """Each stage (in dependency order) with whether it runs and why."""
    running: set[str] = set()
    decisions = []
    for stage in stages:
        run, reason = decide(stage, manifest, running)
        if run:
            running.add(stage.name)
        decisions.append((stage, run, reason))
    return decisions


def restate(decisions: list[tuple[Stage, bool, str]], manifest: Manifest) -> list[str]:
    """Record each reused stage's inputs as read now, where the record says them another way (keys
    read at their defaults, keys no longer read): later plans compare exactly. The stages restated."""
    restated = {}
    for stage, run, _ in decisions:
        if not run and manifest.entry(stage.name)["inputs"] != (now := stage.inputs(manifest)):
            restated[stage.name] = now
    manifest.restate(restated)
    return list(restated)


def describe(decisions: list[tuple[Stage, bool, str]]) -> str:
    width = max(len(stage.name) for stage, _, _ in decisions)
    lines = [f"  {stage.name:<{width}}  {'run' if run else 'reuse':<5}  {reason}" for stage, run, reason in decisions]
    runs = sum(run for _, run, _ in decisions)
    return f"{runs} of {len(decisions)} stages to run:\n" + "\n".join(lines)
