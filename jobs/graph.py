"""The subliminal-learning experiment as stages: each one's name, phase, reads and upstream.

    data                  the split of the WMDP questions         reads data.*, the questions
    teacher               LoRA on the teacher-train split         reads model.*, teacher.*; data
    numbers/<source>/<i>  kept number sequences of replicate i    reads model.*, numbers.*, the engine;
                          (source: teacher or base)               teacher (teacher source only)
    <arm>/<i>             an arm's LoRA on its replicate's rows   reads model.*, its resolved training
                                                                  settings, source, loss; its numbers
    eval/<model>          per-question scores of one model        reads model.*, evaluate.engine,
                                                                  service.max_model_len; data, the model
    report                report.json / .md / .png                reads evaluate.bootstrap/seed; all above

Config values are read from the config as written (before `auto` counts are
resolved for the cluster at hand), so the same preset on a bigger cluster reuses
what it made on a smaller one. Settings that only place work (replicas, CPUs,
chunk sizes of scoring) are not read: they do not change what a stage makes.
"""

from __future__ import annotations

import dataclasses

from jobs.arms import ArmModel, numbers_seed, sources_used
from jobs.config import ExperimentConfig, as_dict
from jobs.manifest import Manifest, flatten
from jobs.stages import Stage, config_reads

PHASES = ("data", "teacher", "numbers", "arms", "evaluate", "report")


def numbers_stage(source: str, replicate: int) -> str:
    return f"numbers/{source}/{replicate}"


def training_rows(manifest: Manifest, sources: list[str], replicate: int) -> int | None:
    """Every arm of a replicate trains on equally many rows (the fewest any source kept), so arms
    differ in content alone. Sources whose numbers have not finished yet are left out; once they
    finish the value is computed again before the arms run."""
    kept = [manifest.output(numbers_stage(s, replicate), "kept") for s in sources if manifest.entry(numbers_stage(s, replicate))]
    return min(kept) if kept else None


def experiment_stages(cfg: ExperimentConfig, models: list[ArmModel], questions_hash: str) -> list[Stage]:
    """Every stage of the experiment, in dependency order."""
    config = as_dict(cfg)
    model = config_reads(config, "model")
    sources = sources_used(models)
    stages = [
        Stage("data", "data", {**config_reads(config, "data"), "questions": questions_hash}, files=("data/teacher_train.jsonl", "data/held_out.jsonl")),
        Stage("teacher", "teacher", {**model, **config_reads(config, "teacher")}, ("data",), files=("teacher/adapter",)),
    ]
    engine = config_reads(config, "numbers", "service.engine", "service.max_model_len")
    for i in range(cfg.replicates):
        for source in sources:
            reads = {**model, **engine, "source": source, "seed": numbers_seed(cfg, i)}
            upstream = ("teacher",) if source == "teacher" else ()
            stages.append(Stage(numbers_stage(source, i), "numbers", reads, upstream, files=(f"numbers/{source}/{i}.jsonl",)))
    for m in models:
        reads = {**model, **flatten(dataclasses.asdict(m.train), "train."), "source": m.source, "shuffled": m.shuffled, "loss": m.loss}
        rows = lambda manifest, i=m.replicate: {"rows": training_rows(manifest, sources, i)}  # noqa: E731
        stages.append(Stage(m.name, "arms", reads, (numbers_stage(m.source, m.replicate),), rows, files=(f"arms/{m.name}/adapter",)))
    scoring = {**model, **config_reads(config, "evaluate.engine", "service.max_model_len")}
    for name, upstream in [("base", ()), ("teacher", ("teacher",))] + [(m.name, (m.name,)) for m in models]:
        stages.append(Stage(f"eval/{name}", "evaluate", scoring, ("data", *upstream), files=(f"eval/{name}.jsonl",)))
    everything = tuple(s.name for s in stages if s.phase in ("numbers", "arms", "evaluate"))
    reads = {**config_reads(config, "evaluate.bootstrap", "evaluate.seed"), "arms": list(cfg.arms), "replicates": cfg.replicates}
    stages.append(Stage("report", "report", reads, everything, files=("report.json",)))
    return stages
