"""Every run of the pipeline in MLflow: one parent run per run directory, one child per trained model.

On by default, into an embedded store: a SQLite file in the cache (`<cache>/mlflow.db`, MLflow 3's
own default backend since 3.7; artifacts beside it in `<cache>/mlflow-artifacts`), so every run of
every preset on this machine is comparable in one UI (`mlflow ui --backend-store-uri
sqlite:///<cache>/mlflow.db`). `tracking.uri` points a run at a team's server instead; `tracking: off`
turns tracking off. The experiment is named after the preset (`tracking.experiment` to choose).

- The parent run, one per run directory and resolved config (tags `preset`, `run_dir`, `preset_chain`,
  `config_digest`, `supersedes`, `git_commit`, `git_dirty`, MLflow's own `mlflow.user`, `mlflow.source.name` and
  `mlflow.source.git.commit`, and, once the report exists, `registration`: confirmatory, repeat or
  exploratory), holds the resolved config (every key a param, and config.json), each comparison's primary verdict
  (effect, CI, p, Holm p, MDE as metrics `verdict.<name>.*`, the sentence as a tag), the accuracy of
  every model and arm per split (as written and over orders), and report.md, report.json and the
  plots as artifacts.
- A child run per trained model (teacher, letter or sham teacher, every arm x replicate), tagged
  with its stage and the stage's hash, holds its resolved training config as params, the loss,
  learning rate and gradient norm (before clipping) of every optimizer step, each at the time the
  step ended (rank 0's `loss_history` and `step_history`), tokens/s, its accuracy per split, and its
  `train_metrics.json` as an artifact.

The pipeline syncs after every phase: what a finished stage made is written once, found again by
the stage's hash, so a rerun that reuses a stage adds no run; a changed stage is a new model and
gets a new child. A rerun with another config (a `--set`, an edited preset) gets a parent of its
own, under which the models it reuses are logged again: each parent's params are what its runs
were made with. A training stage is written when it
finishes, so a resumed training appears once, with its whole loss history. The store is checked
before any work (`check`, jobs/tracking_store.py); a failure while the run goes on is printed and
never stops it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from jobs.experiment.config import ExperimentConfig, TrackingConfig, as_dict
from jobs.experiment.credentials import read_tracking_token
from jobs.experiment.stages import TEACHERS, trained_folder
from jobs.reporting.schema import Report
from jobs.rundir.manifest import Manifest, digest, flatten
from jobs.rundir.registration import source_state
from jobs.stats.results import Primary
from jobs.tracking_store import TrackingStore, sqlite_artifact_root

PIPELINE_TAG = "subliminal.kind"  # "pipeline" on a parent, "model" on a child
ARTIFACTS = ("report.md", "report.json", "transfer.png", "accuracy.png", "training.png", "timeline.png")


class Tracker(TrackingStore):
    """One pipeline's MLflow runs. Made with `for_run`, which returns None when tracking is off."""

    def __init__(
        self,
        uri: str,
        experiment: str,
        run_dir: Path,
        preset_chain: str,
        artifact_root: str | None = None,
        config: dict | None = None,
    ):
        super().__init__(uri, experiment, artifact_root)
        self.run_dir, self.chain = run_dir, preset_chain
        self.config = config or {}  # the resolved config: the parent's params, and its digest picks the parent
        self.config_digest = digest(self.config)[:16]

    @classmethod
    def for_run(cls, cfg: ExperimentConfig, cache: Path, run_dir: Path, preset_chain: str = "") -> Tracker | None:
        if not isinstance(cfg.tracking, TrackingConfig):
            return None
        # The preset's keys first, then MLflow's own variables (as transformers, Ray's setup_mlflow and
        # other trainers read them), then the embedded store and the preset's name.
        uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{cache / 'mlflow.db'}"
        read_tracking_token()  # a server's token from MLFLOW_TRACKING_TOKEN_PATH's file, never from env_vars
        experiment = cfg.tracking.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or cfg.name
        return cls(uri, experiment, run_dir, preset_chain, sqlite_artifact_root(uri), as_dict(cfg))

    # -- after each phase --------------------------------------------------------------------------

    def sync(self, cfg: ExperimentConfig, manifest: Manifest, models: dict) -> None:
        """Write what finished stages made and is not in the store yet; print, never raise."""
        try:
            self._sync(cfg, manifest, models)
        except Exception as err:  # noqa: BLE001 - tracking must never stop or lose the experiment
            print(
                f"[tracking] not written to {self.shown} ({type(err).__name__}: {self.hide(err)}); the run goes on",
                flush=True,
            )

    def _sync(self, cfg: ExperimentConfig, manifest: Manifest, models: dict) -> None:
        parent = self.parent_run()
        report_path = self.run_dir / "report.json"
        report = Report.load(report_path) if manifest.entry("report") and report_path.is_file() else None
        written = 0
        for name, folder in trained_models(cfg, models):
            entry = manifest.entry(name)
            metrics_file = self.run_dir / folder / "train_metrics.json"
            if entry is None or not metrics_file.is_file():
                continue
            child = self.find_child(parent, entry["hash"])
            if child is None:
                child = self.child_run(parent, name, entry, json.loads(metrics_file.read_text()), models.get(name))
                written += 1
            if report is not None:
                self.log_once(child, model_accuracies(report, name))
        if report is not None:
            self.log_once(parent.info.run_id, report_metrics(report))
            self.log_verdict_tags(parent.info.run_id, report)
            for artifact in ARTIFACTS:
                if (self.run_dir / artifact).is_file():
                    self.client.log_artifact(parent.info.run_id, str(self.run_dir / artifact))
        if written:
            print(
                f"[tracking] {written} model run(s) written to {self.shown} (experiment {self.experiment})", flush=True
            )

    # -- the runs ----------------------------------------------------------------------------------

    def parents(self, max_results: int = 1000, any_config: bool = False) -> list:
        """This run directory's parent run under this resolved config (`any_config`: under any; more
        than one only in a store written before configs had a parent each)."""
        query = f"tags.`{PIPELINE_TAG}` = 'pipeline' and tags.run_dir = '{self.run_dir}'"
        if not any_config:
            query += f" and tags.config_digest = '{self.config_digest}'"
        return self.client.search_runs([self.experiment_id()], query, max_results=max_results)

    def parent_run(self):
        """This run directory's parent run, made on first use with the config as params and config.json
        (and running again on a rerun). A rerun with another config (a --set, an edited preset) sets the
        earlier parent aside and starts one of its own, tagged `supersedes` with the earlier run's id, so
        each parent's params say what its runs were made with; the models it reuses are logged under it again."""
        found = self.parents(max_results=1)
        if found:
            if found[0].info.status != "RUNNING":
                self.client.update_run(found[0].info.run_id, status="RUNNING")
            return found[0]
        earlier = self.set_aside(f"superseded by config {self.config_digest}")
        # the one reader of the commit and the dirty flag (the report's registration uses it too)
        state = source_state()
        tags = {
            PIPELINE_TAG: "pipeline",
            "run_dir": str(self.run_dir),
            "preset": self.experiment,
            "preset_chain": self.chain,
            "config_digest": self.config_digest,
        }
        tags |= {"git_commit": str(state["commit"]), "git_dirty": str(state["dirty"])}
        # MLflow's own: its UI shows them
        tags |= {"mlflow.user": user(), "mlflow.source.name": "jobs/pipeline.py", "mlflow.source.type": "JOB"}
        if state["commit"]:
            tags["mlflow.source.git.commit"] = str(state["commit"])
        if earlier:
            tags["supersedes"] = earlier[0].info.run_id
        run = self.client.create_run(self.experiment_id(), tags=tags, run_name=self.run_dir.name)
        self.log_config(run.info.run_id)
        return run

    def log_config(self, run_id: str) -> None:
        """The resolved config: every key as a param (dotted path; MLflow keeps a param's first value,
        hence a parent per config) and whole as config.json."""
        self.log_params(run_id, self.config)
        self.client.log_dict(run_id, self.config, "config.json")

    def log_params(self, run_id: str, values: dict) -> None:
        """`values` flattened to dotted keys, each a param (within MLflow's limits: 6,000 characters a
        value, 100 params a request)."""
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(values).items())]
        for i in range(0, len(params), 100):
            self.client.log_batch(run_id, params=params[i : i + 100])

    def finish(self, status: str) -> None:
        """The pipeline ended: its parent run is marked FINISHED, FAILED or KILLED, so the UI never
        shows an ended run as running. Printed, never raised, as sync."""
        try:
            for run in self.parents(max_results=1):
                self.client.set_terminated(run.info.run_id, status)
        except Exception as err:  # noqa: BLE001
            print(f"[tracking] could not mark the run {status} ({type(err).__name__}: {self.hide(err)})", flush=True)

    def supersede(self) -> None:
        """--fresh: the run directory's parent run is set aside, so the fresh run writes a parent and children of its own."""
        try:
            self.set_aside("before --fresh")
        except Exception as err:  # noqa: BLE001 - as sync: never stops the run
            print(
                f"[tracking] could not set aside the earlier run ({type(err).__name__}: {err}); the run goes on",
                flush=True,
            )

    def set_aside(self, why: str) -> list:
        """This run directory's parent runs, each keeping its runs under a renamed `run_dir` tag; returns them."""
        earlier = self.parents(any_config=True)
        for run in earlier:
            self.client.set_tag(
                run.info.run_id, "run_dir", f"{self.run_dir} ({why} at {time.strftime('%Y-%m-%d %H:%M:%S')})"
            )
        return earlier

    def find_child(self, parent, stage_hash: str) -> str | None:
        query = f"tags.`mlflow.parentRunId` = '{parent.info.run_id}' and tags.stage_hash = '{stage_hash}'"
        found = self.client.search_runs([self.experiment_id()], query, max_results=1)
        return found[0].info.run_id if found else None

    def child_run(self, parent, stage: str, entry: dict, metrics: dict, model) -> str:
        """A new child for this stage's model (its hash has none yet), dated when the stage ran."""
        from mlflow.entities import Metric

        tags = {
            PIPELINE_TAG: "model",
            "mlflow.parentRunId": parent.info.run_id,
            "stage": stage,
            "stage_hash": entry["hash"],
        }
        if model is not None:
            tags.update(
                arm=model.arm,
                replicate=str(model.replicate),
                numbers=model.source,
                loss=model.loss,
                teacher=model.teacher,
                base=model.base,
            )
        finished = entry.get("finished", time.time())
        started = int((finished - entry.get("seconds", 0.0)) * 1000)
        run = self.client.create_run(parent.info.experiment_id, tags=tags, run_name=stage, start_time=started)
        run_id = run.info.run_id
        self.log_params(run_id, metrics.get("train_config", {}))
        now = int(finished * 1000)
        series = step_series(metrics, now)
        series += [
            Metric(key, float(metrics[key]), now, 0)
            for key in ("tokens_per_s", "step_time_s", "padding_fraction")
            if metrics.get(key) is not None
        ]
        for i in range(0, len(series), 1000):  # a request holds at most 1,000 metrics
            self.client.log_batch(run_id, metrics=series[i : i + 1000])
        self.client.log_artifact(
            run_id, str(self.run_dir / trained_folder(stage, model is not None and model.full) / "train_metrics.json")
        )
        self.client.set_terminated(run_id, end_time=int(finished * 1000))
        return run_id

    def log_once(self, run_id: str | None, values: dict[str, float]) -> None:
        """Log the metrics the run does not hold yet with the same value."""
        if run_id is None or not values:
            return
        from mlflow.entities import Metric

        held = self.client.get_run(run_id).data.metrics
        now = int(time.time() * 1000)
        new = [Metric(k, float(v), now, 0) for k, v in values.items() if v is not None and held.get(k) != float(v)]
        for i in range(0, len(new), 1000):
            self.client.log_batch(run_id, metrics=new[i : i + 1000])

    def log_verdict_tags(self, run_id: str, report: Report) -> None:
        for name, sentence in verdict_sentences(report).items():
            self.client.set_tag(run_id, f"verdict.{name}", sentence[:5000])
        self.client.set_tag(run_id, "registration", report.provenance.registration.status)


def step_series(metrics: dict, default_ms: int) -> list:
    """Each optimizer step's loss, learning rate and gradient norm (before clipping), stamped with the
    time the step ended (`step_history`); a model trained before those were kept has its losses
    alone, all stamped `default_ms`."""
    from mlflow.entities import Metric

    marks = {int(step): (int(at * 1000), lr, norm) for step, at, lr, norm in metrics.get("step_history", [])}
    series = [
        Metric("loss", float(loss), marks.get(int(step), (default_ms,))[0], int(step))
        for step, loss in metrics.get("loss_history", [])
    ]
    for step, (at, lr, norm) in sorted(marks.items()):
        series += [Metric("lr", float(lr), at, step), Metric("grad_norm", float(norm), at, step)]
    return series


def user() -> str:
    """Who ran the pipeline, as MLflow's own runs record it."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        return str(os.getuid())


def trained_models(cfg: ExperimentConfig, models: dict) -> list[tuple[str, str]]:
    """(stage name, folder of its train_metrics.json) of every model trained in the run."""
    teachers = [
        (name, trained_folder(name))
        for name in TEACHERS
        if name == "teacher" or any(m.teacher == name for m in models.values())
    ]
    return teachers + [(name, trained_folder(name, m.full)) for name, m in models.items()]


def model_accuracies(report: Report, model: str) -> dict[str, float]:
    """A model's accuracy per split as the report gives it (over the scored orders)."""
    entry = report.models.get(model) or next(
        (r for arm in report.arms.values() for r in arm.replicates if r.model == model), None
    )
    return {f"accuracy.{split}": value for split, value in ((entry and entry.accuracy_by_split) or {}).items()}


def report_metrics(report: Report) -> dict[str, float]:
    """The parent's numbers: each comparison's primary test, and every model's and arm's accuracy
    per split as written and over the orders of the choices."""
    values = {}
    for name, test in primary_tests(report).items():
        for key, value in (
            ("effect", test.value),
            ("p_value", test.p_value),
            ("p_family", test.p_family),
            ("mde", test.mde),
        ):
            values[f"verdict.{name}.{key}"] = value
        if test.ci95:
            values[f"verdict.{name}.ci_low"], values[f"verdict.{name}.ci_high"] = test.ci95
        values[f"verdict.{name}.detected"] = float(bool(test.detected))
    for model, splits in (report.accuracy_by_order.models if report.accuracy_by_order else {}).items():
        for split, acc in splits.items():
            values[f"accuracy.{model}.{split}.as_written"], values[f"accuracy.{model}.{split}.over_orders"] = (
                acc.as_written,
                acc.over_orders,
            )
    return {k: v for k, v in values.items() if isinstance(v, int | float)}


def primary_tests(report: Report) -> dict[str, Primary]:
    """Each arm's and contrast's primary test (its declared split, metric and direction)."""
    tests = {name: arm.transfer.primary for name, arm in report.arms.items() if arm.transfer is not None}
    return tests | {name: c.primary for name, c in report.contrasts.items()}


def verdict_sentences(report: Report) -> dict[str, str]:
    return {name: entry.verdict for name, entry in {**report.arms, **report.contrasts}.items() if entry.verdict}
