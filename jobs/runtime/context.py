"""What every phase is handed: the run, with the preset resolved for this cluster and its run directory.

The pipeline (jobs/pipeline.py) builds one `RunContext` once the plan is
printed and the base models are at hand; each phase module's `run(ctx, todo)`
reads what it needs from it and records every stage it finishes through
`ctx.record`, so the manifest is written one way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from jobs.experiment.arms import ArmModel
from jobs.experiment.config import ExperimentConfig
from jobs.experiment.stages import trained_folder
from jobs.rundir.manifest import Manifest, Outputs
from jobs.rundir.plan import Stage

TRAIN_STORAGE = "ray_train"  # Ray Train's storage path (checkpoints) under the run directory: every node must see it


@dataclass
class RunContext:
    cfg: ExperimentConfig  # every `auto` count resolved for this cluster (jobs/sizing/placement.py)
    run_dir: Path
    manifest: Manifest
    cache: Path  # where tiny models and tokenized data are built
    paths: dict[str, str]  # the base models: {"base": ..., "other_base": ... when an arm declares one}
    models: dict[str, ArmModel]  # arm models by name (`<arm>/<i>`), from the preset as written
    questions: list[dict]  # every WMDP question the data stage splits
    app: str  # the Serve application's name for this run
    lora_rank: int  # the largest rank a service of this run must accept
    arm_runs: int  # training runs of arms at once (placement)
    registration: dict | None = None  # what the report may claim, decided at the start (jobs/rundir/registration.py)
    world: dict | None = None  # the tiny world's sham draw chosen on the base (jobs/sources/sham_draw.py); None off it
    spans: list[dict] = field(default_factory=list)  # the running phase's timeline spans (`span`), taken at its end

    def span(self, lane: str, kind: str, start: float, end: float) -> None:
        """One span of the running phase's timeline (jobs/reporting/timeline.py names the kinds): `lane`
        is what did it (a training run, a Serve application), `start`/`end` wall-clock times. A span
        every job of a training run reports (its start-up, its model load) is kept once."""
        span = {"lane": lane, "kind": kind, "start": round(start, 3), "end": round(end, 3)}
        if end >= start and span not in self.spans:
            self.spans.append(span)

    @property
    def model_path(self) -> str:
        return self.paths["base"]

    def trained(self, name: str) -> Path:
        """Where a trained model keeps what training made (stages.trained_folder): a teacher's or
        arm model's adapter, or a fully fine-tuned arm model's model folder."""
        return self.run_dir / trained_folder(name, name in self.models and self.models[name].full)

    def record(self, stage: Stage, started: float, outputs: Outputs | dict, files=()) -> None:
        """Record a finished stage with its outputs record, of its kind (`stage.record`), and the
        digests of its output files: those it declares, and `files`. A plain dict is read as its
        kind's record (the report phase still passes one)."""
        if isinstance(outputs, dict):
            outputs = stage.record.model_validate(outputs)
        if type(outputs) is not stage.record:
            raise TypeError(f"stage {stage.name} records {stage.record.__name__} outputs, not {type(outputs).__name__}")
        self.manifest.record(
            stage.name, stage.inputs(self.manifest), time.time() - started, outputs.plain(), (*stage.files, *files)
        )
        print(f"[{stage.phase}] {stage.name} done in {time.time() - started:.0f}s", flush=True)
