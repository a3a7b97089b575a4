"""The subliminal-learning experiment as one Ray job, from teacher to report.

    python jobs/pipeline.py [--config configs/tiny.yaml] [--run-dir DIR] [--set key.path=value ...] [--fresh] [--plan]
    ray job submit --working-dir . -- python jobs/pipeline.py
    subliminal-pipeline --config tiny-evidence --plan      # installed: a shipped preset by name

With no arguments it runs the tiny preset (model and data built on first use)
on the Ray cluster it is submitted to, or on a local one it starts. Phases
(jobs/phases/, one module each; jobs/experiment/stages.py declares each stage's inputs):

1. data      WMDP questions split into teacher-train and held-out, disjoint by text
2. teacher   Ray Train LoRA on the train split (prompt = the WMDP question, completion = its letter);
             with it, when an arm needs it, the positive control's letter teacher (one run)
3. numbers   per replicate, the teacher and the base model continue number sequences through
             one Serve deployment, all replicates at once; completions are filtered
4. arms      every arm x replicate declared in the preset (jobs/experiment/arms.py), trained side by side:
             several adapters per Ray Train run over one copy of the base, several runs at once
             where the GPUs allow (jobs/sizing/placement.py); arms on another base model
             (jobs/experiment/bases.py) in runs of their own over that base
5. evaluate  every model scored on the train and held-out questions in parallel (and the
             snapshots of arms that keep them: transfer against training steps), one service
             per base model
6. report    report.json, report.md and its plots (transfer, accuracy, training, timeline) in the run directory (docs/report.md)

Before any work it prints the plan: each stage and whether it is reused or runs,
and why (`--plan` prints only that). A change reruns what depends on it and
nothing else; an interrupted stage resumes (training from its last checkpoint).
The Serve application is named after the run and torn down when a phase ends,
fails, or the job is stopped (`ray job stop`); one left behind by a driver
killed outright is deleted by the next run of the same command. One pipeline
at a time uses a run directory: a second one stops at once naming the holder
(jobs/rundir/run_lock.py).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import psutil

if __package__ in (None, ""):  # `python jobs/pipeline.py`: import from the repository root, not jobs/
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from common import numerics  # noqa: E402

# not imported by another program
OWN_COMMAND = __name__ == "__main__" or Path(sys.argv[0]).name == "subliminal-pipeline"
if OWN_COMMAND:  # the CPU numerics before the imports below load torch (the preset's mode is checked once it is read)
    try:
        numerics.pin(os.environ.get(numerics.ENV, numerics.DEFAULT))
    except numerics.NumericsError as err:
        sys.exit(f"error: {err}")

from common.cli import program  # noqa: E402
from common.files import default_cache_dir  # noqa: E402
from jobs.experiment.arms import arm_models  # noqa: E402
from jobs.experiment.bases import base_paths, check_kl_tokenizers, teacher_base, tiny_base_missing  # noqa: E402
from jobs.experiment.config import ExperimentConfig, as_dict, load_experiment, pair_config  # noqa: E402
from jobs.experiment.pins import unpinned, unpinned_cluster  # noqa: E402
from jobs.experiment.presets import describe_chain, load_preset  # noqa: E402
from jobs.experiment.stages import experiment_stages  # noqa: E402
from jobs.job_log import quiet_driver, runtime_env  # noqa: E402
from jobs.phases import PHASES  # noqa: E402
from jobs.phases.evaluate import check_orders, context_check  # noqa: E402
from jobs.phases.numbers import NoNumbersError  # noqa: E402
from jobs.reporting.pairs import write_pairs_report  # noqa: E402
from jobs.reporting.schema import Report  # noqa: E402
from jobs.reporting.timeline import overhead_lines  # noqa: E402
from jobs.rundir.manifest import Manifest, RunDirError, digest, flatten  # noqa: E402
from jobs.rundir.plan import Stage, describe, plan, restate  # noqa: E402
from jobs.rundir.registration import record_run, registration  # noqa: E402
from jobs.rundir.run_lock import check_free, hold_run_dir  # noqa: E402
from jobs.runtime.context import TRAIN_STORAGE, RunContext  # noqa: E402
from jobs.runtime.service import (  # noqa: E402
    delete_leftover_app,
    guard_a_local_proxy,
    max_lora_rank,
    stop_on_sigterm,
)
from jobs.runtime.storage_reach import StorageReach  # noqa: E402
from jobs.sizing.placement import place, resolved  # noqa: E402
from jobs.sources.sham_draw import base_sham_draw  # noqa: E402
from jobs.sources.wmdp import load_wmdp  # noqa: E402
from jobs.tracking import Tracker  # noqa: E402
from train.cluster import cluster_capacity, load_launcher_config  # noqa: E402
from train.data import stats_actor_on_this_node  # noqa: E402
from train.model import check_model_path  # noqa: E402


def default_run_dir(name: str) -> Path:
    """Persistent, outside Ray's throwaway copy of the job's working directory."""
    return Path(os.environ.get("SUBLIMINAL_RUNS", Path.home() / "subliminal-runs")) / name


class Experiment:
    """A preset and its run directory: the stages it declares (from the config as written, so the
    same preset on a bigger cluster reuses what it made on a smaller one) and running them."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: Path,
        fresh: bool = False,
        preset_chain: str = "",
        registration: dict | None = None,
    ):
        self.cfg, self.run_dir, self.fresh, self.registration = cfg, run_dir, fresh, registration
        self.cache = Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()
        self.models = {m.name: m for m in arm_models(cfg)}
        self.tracker = Tracker.for_run(cfg, self.cache, run_dir, preset_chain)  # None under `tracking: off`
        self.world: dict | None = None  # the tiny world's sham draw on this run's base, once chosen
        self.reach = StorageReach([run_dir, run_dir / TRAIN_STORAGE])  # what every Ray node must see

    def declared(self, build_base: bool = True) -> tuple[list[dict], list[Stage]]:
        """The WMDP questions, and every stage declared from them and the config as written. Loading
        the questions may download them: a run does it once the preset is known to fit the cluster.
        The tiny world's questions depend on the base: the sham's facts are the draw chosen for
        balance on it (jobs/sources/sham_draw.py), so its base is put in the cache first where it is
        the tiny one; a plan (`build_base` False) does no work and assumes the default draw instead."""
        draw, synthetic = {}, self.cfg.data.source == "synthetic"
        if synthetic and (build_base or not tiny_base_missing(self.cfg, self.cache)):
            draw = {"sham_draw": self.choose_world()["sham_draw"]}
        elif synthetic:
            print(
                "[world] the tiny base is not in the cache yet: this plan assumes the default sham draw (a run puts the "
                "base there, copied from the shipped one or built, and chooses the draw on it)",
                flush=True,
            )
        data = self.cfg.data
        questions = load_wmdp(
            data.source, tuple(data.subsets), self.cache, pair=data.pair, revision=data.revision, **draw
        )
        return questions, experiment_stages(self.cfg, list(self.models.values()), digest(questions))

    def choose_world(self) -> dict:
        """The tiny world's sham draw on the teacher's base (built first where it is the tiny one), once."""
        if self.world is None:
            base = teacher_base(self.cfg, self.cache)
            check_model_path(base)  # a clear error for a base that is not there, before the draw reads it
            self.world = base_sham_draw(base, self.cache, self.cfg.data.pair)
            lean = ", ".join(
                f"{split} {v['answer']:.3f} true / {v['sham']:.3f} sham" for split, v in self.world["lean"].items()
            )
            pair = f"pair {self.cfg.data.pair}: " if self.cfg.data.pair else ""
            print(
                f"[world] {pair}sham draw {self.world['sham_draw']}, the first balanced on the base ({lean}); base weights sha256 {self.world['base_weights_sha256']}",
                flush=True,
            )
        return self.world

    def show_plan(self) -> str:
        """The plan for this run directory, without doing anything (`--plan`)."""
        _, stages = self.declared(build_base=False)
        return describe(plan(stages, Manifest(self.run_dir)))

    def run(self) -> Report:
        import ray

        check_free(self.run_dir)  # a run directory another pipeline holds stops here, before Ray starts
        if self.tracker:
            self.tracker.check()  # an unreachable tracking store stops here too, naming its URI
            print(f"[tracking] writing to {self.tracker.shown} (experiment {self.tracker.experiment})", flush=True)
        quiet_driver()  # a readable log: Ray's progress bars and per-dataset lines off (jobs/job_log.py)
        if not ray.is_initialized():
            guard_a_local_proxy()
            ray.init(runtime_env=runtime_env(self.cfg.numerics))
        stats_actor_on_this_node()  # on the driver's node: an autoscaler can then remove every worker node when idle
        signal.signal(signal.SIGTERM, stop_on_sigterm)  # after ray.init, which installs its own
        placement = place(self.cfg, cluster_capacity())  # before any work: a preset that cannot fit stops here
        print(f"[placement] {placement.summary(self.cfg)}", flush=True)
        with hold_run_dir(self.run_dir):  # one pipeline per run directory, from here until the run ends
            # before any work: a node that cannot see the run directory or Ray Train's storage stops here
            self.reach.check()
            print(
                f"[storage] {len(self.reach.checked)} node(s) see {self.run_dir} and its {TRAIN_STORAGE}/", flush=True
            )
            try:
                self.run_phases(placement)
            except BaseException as err:
                if self.tracker:
                    self.tracker.finish("FAILED" if isinstance(err, Exception) else "KILLED")
                raise
            if self.tracker:
                self.tracker.finish("FINISHED")
        return summary(self.run_dir)

    def run_phases(self, placement) -> None:
        """Every phase with a stage to run, in order; the tracking store synced after each."""
        ctx, stages = self.prepare(placement)
        synced = first = False
        for phase, run_phase in PHASES.items():
            todo = [stage for stage, run, _ in plan(stages, ctx.manifest) if run and stage.phase == phase]
            if todo:
                print(f"[{phase}] starting {len(todo)} stage(s)", flush=True)
                started = time.time()
                if not first:  # the driver's own start: interpreter, imports, Ray, the plan (the timeline's first bar)
                    began = psutil.Process().create_time()
                    ctx.manifest.record_spans(
                        "start",
                        began,
                        started - began,
                        [{"lane": "driver", "kind": "start-up", "start": began, "end": started}],
                    )
                    first = True
                ctx.spans.clear()
                self.reach.check()  # a node that joined since the last check gets no work before it is checked
                run_phase(ctx, todo)
                seconds = time.time() - started
                ctx.manifest.record_phase(phase, seconds, started, ctx.spans)
                print(f"[{phase}] {len(todo)} stage(s) done in {seconds:.0f}s", flush=True)
                if self.tracker:
                    self.tracker.sync(self.cfg, ctx.manifest, self.models)
                    synced = True
        if self.tracker and not synced:  # a run that reused every stage still finds (or writes) its runs
            self.tracker.sync(self.cfg, ctx.manifest, self.models)

    def prepare(self, placement) -> tuple[RunContext, list[Stage]]:
        """With the run directory held: --fresh clears it, the plan is printed, the base models checked."""
        manifest = Manifest(self.run_dir, self.fresh)
        if self.fresh and self.tracker:
            self.tracker.supersede()  # the run directory's earlier parent run stays, renamed; this run gets its own
        app = f"subliminal-{self.cfg.name}-{digest(str(self.run_dir))[:8]}"
        delete_leftover_app(app)  # before any work: a killed driver's replicas may hold GPUs
        questions, stages = self.declared()
        decisions = plan(stages, manifest)
        print(f"[plan] {describe(decisions)}", flush=True)
        restated = restate(decisions, manifest)  # stages stored under an earlier identity, recorded as read now
        if restated:
            print(f"[plan] {len(restated)} reused stage(s) recorded with their inputs as read now", flush=True)
        cfg = resolved(self.cfg, placement)  # phases see numbers, not `auto`
        paths = base_paths(cfg, self.cache)  # {"base": ..., "other_base": ... when an arm declares one}
        for path in paths.values():
            check_model_path(path)
        check_kl_tokenizers(cfg, paths)
        check_orders(questions, cfg.evaluate.orders())
        print(
            f"[evaluate] {context_check(paths['base'], questions, cfg.service.max_model_len, cfg.evaluate.format)}",
            flush=True,
        )
        lora_rank = max_lora_rank([self.cfg.teacher.lora_rank] + [m.train.lora_rank for m in self.models.values()])
        context = RunContext(
            cfg,
            self.run_dir,
            manifest,
            self.cache,
            paths,
            self.models,
            questions,
            app,
            lora_rank,
            placement.arm_runs,
            self.registration,
            self.world,
        )
        return context, stages


def experiments(cfg: ExperimentConfig, run_dir: Path, fresh: bool, chain: str, claim: dict) -> list[Experiment]:
    """What one pipeline command runs: the preset on its run directory, or, for a preset that lists
    teacher–sham `pairs`, the same design once per pair, each a run of its own under <run dir>/pairs/<p>."""
    if not cfg.pairs:
        return [Experiment(cfg, run_dir, fresh, chain, claim)]
    return [
        Experiment(pair_config(cfg, pair), run_dir / "pairs" / str(pair), fresh, chain, claim) for pair in cfg.pairs
    ]


def pooled_summary(run_dir: Path, cfg: ExperimentConfig) -> None:
    """The pairs' reports pooled (jobs/reporting/pairs.py: pooled.json, pooled.md, forest.png) by the
    preset's test and assumed tau, the family's pooled primaries printed."""
    pairs = cfg.pairs
    pooled = write_pairs_report(run_dir, pairs, cfg.evaluate.pooled_test, cfg.evaluate.assumed_tau)
    for name in pooled.family:
        p = pooled.comparisons[name].primary
        if p.estimate is None:
            print(f"[pooled] {name}: {p.note}", flush=True)
            continue
        ci = "no interval" if p.ci95 is None else f"95% CI {p.ci95[0]:+.4f} to {p.ci95[1]:+.4f}"
        print(
            f"[pooled] {name}: {p.split} {p.metric} {p.direction} {p.estimate:+.4f} ({ci}, p {p.p_value:.3g}, tau {p.tau:.4f}) over {len(pairs)} pairs",
            flush=True,
        )
    print(f"[pooled] {run_dir / 'pooled.md'}", flush=True)


def summary(run_dir: Path) -> Report:
    """report.json, with its headline figures printed: where the minutes went first, then each model's
    accuracy, and last the preset's primary verdicts and the report's path, so the log ends on them."""
    report = Report.load(run_dir / "report.json")
    for line in overhead_lines(report.timeline):  # where the minutes went that were not compute (timeline.png)
        print(line, flush=True)
    for name, m in report.models.items():
        ci = f"95% CI {m.ci95[0]:.3f}-{m.ci95[1]:.3f}" if m.ci95 else "no CI with one replicate"
        print(f"[report] {name}: accuracy {m.overall:.3f} ({ci})", flush=True)
    family = set(report.family.comparisons)
    for name, arm in report.arms.items():  # the preset's primary verdicts (Holm across them), not a secondary figure
        if name in family:
            print(f"[report] {arm.verdict}", flush=True)
    for name, c in report.contrasts.items():
        if name in family:
            print(f"[report] contrast {name}: {c.verdict}", flush=True)
    print(f"[report] {run_dir / 'report.md'}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program("python jobs/pipeline.py"), description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=None, help="YAML preset: a path or a shipped preset's name (default: tiny)")
    parser.add_argument(
        "--run-dir", type=Path, default=None, help="default: ~/subliminal-runs/<config name> ($SUBLIMINAL_RUNS)"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--fresh", action="store_true", help="delete the run directory and start over")
    parser.add_argument(
        "--plan", action="store_true", help="print which stages would be reused or run, and why; run nothing"
    )
    args = parser.parse_args(argv)
    from common.config import ConfigError
    from common.files import DataError
    from common.numerics import NumericsError
    from serve.settings import ServiceError

    try:
        cfg = load_experiment(args.config, args.overrides)
        run_dir = (args.run_dir or default_run_dir(cfg.name)).absolute()
        files = load_preset(args.config)[1]
        chain = describe_chain(files)
        design, defaults = flatten(as_dict(cfg)), flatten(as_dict(ExperimentConfig()))
        claim = registration(
            files,
            args.overrides,
            digest(as_dict(cfg)),
            design=design,
            defaults=defaults,
            run_dir=run_dir,
            fresh=args.fresh,
        )
        runs = experiments(cfg, run_dir, args.fresh, chain, claim)
        for source in unpinned(cfg) + unpinned_cluster(load_launcher_config()):  # what can change under the same config
            print(f"[pins] warning: {source}", flush=True)
        if args.plan:
            print(f"preset: {chain}")
            print(
                f"registration: {claim['status']}" + (f" ({'; '.join(claim['reasons'])})" if claim["reasons"] else "")
            )
            for experiment in runs:
                plan_text = experiment.show_plan() if not args.fresh else "--fresh: every stage runs"
                print(
                    f"pair {experiment.cfg.data.pair} ({experiment.run_dir}): {plan_text}" if cfg.pairs else plan_text
                )
        else:
            # runs this command again if torch is loaded under another mode
            numerics.enter(cfg.numerics, reexec=OWN_COMMAND and argv is None)
            print(numerics.log_line(cfg.numerics), flush=True)
            if claim["status"] != "exploratory" and not claim["resumes"]:
                record_run(claim)  # before any stage runs: every later run of this design is a repeat
            for experiment in runs:
                if cfg.pairs:
                    print(f"[pairs] pair {experiment.cfg.data.pair} of {cfg.pairs}: {experiment.run_dir}", flush=True)
                experiment.run()
            if cfg.pairs:
                pooled_summary(run_dir, cfg)
    except (
        ConfigError,
        DataError,
        RunDirError,
        NoNumbersError,
        ServiceError,
        NumericsError,
        FileNotFoundError,
        FileExistsError,
    ) as err:  # TrackingError is a ConfigError
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
