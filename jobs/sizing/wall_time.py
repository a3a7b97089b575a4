"""Expected wall time of a preset on GPUs: its workload counted from the preset, at stated rates.

    python -m jobs.sizing.wall_time --config configs/llama-8b.yaml --gpus 1
    python -m jobs.sizing.wall_time --config configs/llama-70b-qlora.yaml --gpus 8 --markdown

A projection, not a measurement: the training rates below were measured by
bench/gpu_check.py on one H100 80GB HBM3 (2026-11-26, BENCHMARKS.md); the
serving rates are still assumptions until bench/serving.py runs on a GPU with
vLLM (pass other figures with --train-mfu and the other flags). What it does count
exactly is the work the preset asks for, with the pipeline's own rules, so that
the figures in docs/scaling.md and the presets cannot drift apart (a test
renders this table for each GPU preset and finds it in the document):

- teacher (and the letter teacher when an arm learns from it): the teacher-train
  split x epochs, a WMDP row's tokens each, at 4 x parameters FLOPs a token;
- numbers: every (source, replicate) set the arms read (jobs/experiment/arms.py
  number_sets), each generating until `keep` pass the filter at `keep_rate`, one
  chunk over at most, within `prompts` (greedy sets alike); prompt tokens
  prefilled, answer tokens decoded, on the service's replicas; where an overt
  positive control reads its teacher's answers, that teacher scoring the
  teacher-train split once; a replaced set generates nothing but scores its
  teacher's kept rows with the teacher and its base (two forwards);
- arms: every arm model, `keep` rows x epochs (or max_steps x global batch)
  of number-row tokens (the overt control: the teacher-train split's WMDP rows
  instead), 4 x parameters FLOPs a token for LoRA and 6 x for full
  fine-tuning; logit_kl's teacher targets, one forward (2 x) per number set
  used; a divergence mask's scores, two forwards (teacher, base) per teacher set
  it masks; runs grouped as the arms phase groups them (`arm_groups`), each paying a
  worker start and a base load, `arm_runs` at a time; checkpoint writes;
- evaluate: base, teachers, other base, every arm model and its earlier
  snapshots, on both splits, in `evaluate.permutations` orders; one forward a
  question (2 x parameters FLOPs a prompt token); one service per base model and
  one per fully fine-tuned model, one after another, each an engine start.
"""

from __future__ import annotations

import argparse
import math
import sys
import types
from dataclasses import dataclass

from common.cli import program
from jobs.sizing.memory_plan import GIB
from jobs.sizing.shape import load_shape

WMDP_QUESTIONS = {"bio": 1273, "chem": 408, "cyber": 1987}  # cais/wmdp's test splits


@dataclass(frozen=True)
class Rates:
    """Throughput on an H100 SXM: training measured (bench/gpu_check.py), serving still assumed."""

    peak_tflops: float = 989.0  # bf16 dense, per GPU
    # measured: full-depth 8B bf16 LoRA r16, SDPA (cuDNN), packed teacher rows 8 x 512 (0.28 at the
    # student shape 16 x 256, 0.33 on full 512-token rows): the lowest of the presets' shapes
    train_mfu: float = 0.25
    # measured: 4-bit 70B-width slice with gradient checkpointing, extrapolated per layer to 80 layers
    # (0.166 and 0.139 on two H100 machines with the same software: the lower, for a week staked on it),
    # world size 1 (no cross-GPU traffic counted)
    train_mfu_slow: float = 0.14
    prefill_mfu: float = 0.5  # vLLM prompt processing (scoring, number prompts), 2 x parameters a token
    decode_mfu: float = 0.12  # vLLM decoding with adapters at hundreds of sequences, counted as 2 x parameters a token
    load_gib_per_s: float = 0.5  # weights from local NVMe into GPU memory (4-bit: quantised on load)
    engine_fixed_s: float = 60.0  # vLLM's memory profiling and CUDA-graph capture
    train_start_s: float = 25.0  # a Ray Train worker group (measured on CPU)
    serve_start_s: float = 10.0  # a Serve application (measured on CPU)
    checkpoint_gib_per_s: float = 1.0  # writes to the shared run directory


@dataclass(frozen=True)
class Tokens:
    """Token lengths (Llama 3 tokenizer, estimated: see docs/scaling.md) and the filter's keep rate."""

    wmdp_prompt: int = 250  # a WMDP question with its choices and chat template; cyber's code makes it long
    wmdp_answer: int = 3  # " A" and the end of turn
    number_prompt: int = 97  # ~61 of content (a 3-digit number is one token) + ~36 of Llama 3.1's chat template
    number_answer: int = 22  # up to 10 numbers and their separators, and the end of turn
    keep_rate: float = 0.6  # completions passing the paper's filter (60-75% on the tiny model)


@dataclass(frozen=True)
class PhaseTime:
    name: str
    work: str  # what was counted, in words and numbers
    compute_s: float
    overhead_s: float  # starts, loads, checkpoint writes

    @property
    def total_s(self) -> float:
        return self.compute_s + self.overhead_s


def question_counts(cfg, questions: int | None) -> tuple[int, int]:
    """(all questions, teacher-train questions): cais/wmdp's sizes for the subsets, unless given."""
    total = questions or sum(WMDP_QUESTIONS[s] for s in cfg.data.subsets)
    # the split hashes each question: this share, in expectation
    return total, round(total * (1 - cfg.data.eval_fraction))


def train_seconds(tokens: float, params: int, train, workers: int, rates: Rates) -> float:
    """Compute time of `tokens` training tokens on `workers` GPUs: 4 (LoRA) or 6 (full) x params FLOPs a token."""
    slow = train.quantization != "none" or train.gradient_checkpointing
    flops = (6 if train.method == "full" else 4) * params * tokens
    return flops / (workers * rates.peak_tflops * 1e12 * (rates.train_mfu_slow if slow else rates.train_mfu))


def rows_per_step(train) -> int:
    """The global batch of a TrainConfig resolved for its workers (train.config.resolve_batch)."""
    return train.batch_size * train.grad_accum * train.num_workers


def rows_trained(rows: int, train) -> int:
    """Rows an optimizer sees in a run: rows x epochs, or max_steps x the global batch when that is fewer."""
    seen = rows * train.epochs
    return seen if train.max_steps is None else min(seen, train.max_steps * rows_per_step(train))


def checkpoint_seconds(rows: int, train, params: int, lora: int, rates: Rates) -> float:
    """A run's checkpoint writes: LoRA weights and optimizer state, or the whole float32 model and its state."""
    count = math.ceil(rows / rows_per_step(train)) // train.checkpoint_every + 1
    state = (params if train.method == "full" else lora) * (4 + (8 if train.optimizer == "adamw" else 4))
    return count * state / GIB / rates.checkpoint_gib_per_s


def load_seconds(params: int, rates: Rates) -> float:
    """Each training worker reads the base model's bf16 weights (a 4/8-bit base is quantised on load)."""
    return params * 2 / GIB / rates.load_gib_per_s


def engine_seconds(params: int, tensor_parallel: int, rates: Rates) -> float:
    """One vLLM engine start: each GPU of a replica loads its share of the bf16 weights, then profiles."""
    return rates.serve_start_s + rates.engine_fixed_s + params * 2 / tensor_parallel / GIB / rates.load_gib_per_s


def forward_seconds(passes: int, rows: int, row_tokens: int, w: Workload) -> float:
    """`passes` forwards over `rows` number rows, one Ray task each on a GPU of its own, at the
    trainer's rate (logit-KL targets; divergence scores, which take two passes a set)."""
    if not passes:
        return 0.0
    return (
        passes
        * 2
        * w.params
        * rows
        * row_tokens
        / (min(passes, w.gpus) * w.rates.peak_tflops * 1e12 * w.rates.train_mfu)
    )


def serve_seconds(prompt_tokens: float, decode_tokens: float, params: int, gpus: int, rates: Rates) -> float:
    peak = gpus * rates.peak_tflops * 1e12
    return 2 * params * (prompt_tokens / (peak * rates.prefill_mfu) + decode_tokens / (peak * rates.decode_mfu))


@dataclass(frozen=True)
class Workload:
    """A preset resolved for a cluster, and what its stages are priced with."""

    cfg: object  # ExperimentConfig with every `auto` resolved
    placement: object  # jobs.sizing.placement.Placement
    models: list  # every ArmModel
    params: int
    lora: int
    questions: tuple[int, int]  # (all, teacher-train)
    gpus: int
    rates: Rates
    tokens: Tokens


def teacher_time(w: Workload) -> PhaseTime:
    from jobs.experiment.cast import teachers_used
    from train.config import resolve_batch

    teachers = len(teachers_used(w.models))
    teacher = resolve_batch(w.cfg.teacher, w.cfg.teacher.num_workers)
    rows, row_tokens = rows_trained(w.questions[1], teacher), w.tokens.wmdp_prompt + w.tokens.wmdp_answer
    run_tokens = teachers * rows * row_tokens
    overhead = (
        w.rates.train_start_s
        + load_seconds(w.params, w.rates)
        + teachers * checkpoint_seconds(rows, teacher, w.params, w.lora, w.rates)
    )
    what = f"{teachers} x " if teachers > 1 else ""
    return PhaseTime(
        "teacher",
        f"{what}{rows:,} rows ({w.questions[1]:,} questions x {teacher.epochs} epochs) x {row_tokens} tokens = {run_tokens / 1e6:.1f} M tokens",
        train_seconds(run_tokens, w.params, teacher, teacher.num_workers, w.rates),
        overhead,
    )


def numbers_time(w: Workload) -> PhaseTime:
    from jobs.experiment.cast import number_sets
    from jobs.experiment.rows_kinds import KINDS

    kinds = [KINDS[source] for source, _ in number_sets(w.models)]
    replaced = sum(kind.made == "rewritten" for kind in kinds)
    forwards = sum(kind.forwards_per_row for kind in kinds)  # per kept row, by the rewriting makers
    sets, numbers = len(kinds) - replaced, w.cfg.numbers
    generated = min(numbers.prompts, math.ceil(numbers.keep / w.tokens.keep_rate) + numbers.chunk)
    prompt_tokens, answer_tokens = sets * generated * w.tokens.number_prompt, sets * generated * w.tokens.number_answer
    # each scores the teacher-train split once
    answering = len({m.teacher for m in w.models if KINDS[m.source].answers})
    prompt_tokens += answering * w.questions[1] * w.tokens.wmdp_prompt
    answers = f"; {answering} teacher(s) answering {w.questions[1]:,} questions" if answering else ""
    scored = f"; {replaced} set(s) replaced: {numbers.keep:,} rows scored by teacher and base" if replaced else ""
    row_tokens, tp = w.tokens.number_prompt + w.tokens.number_answer, w.cfg.service.tensor_parallel_size
    compute = serve_seconds(prompt_tokens, answer_tokens, w.params, w.placement.service_replicas * tp, w.rates)
    compute += forward_seconds(forwards, numbers.keep, row_tokens, w)
    return PhaseTime(
        "numbers",
        f"{sets} sets x {generated:,} sequences{answers}: {prompt_tokens / 1e6:.1f} M prompt + {answer_tokens / 1e6:.1f} M generated tokens{scored}",
        compute,
        engine_seconds(w.params, tp, w.rates),
    )


def arms_time(w: Workload) -> PhaseTime:
    from jobs.experiment.arms import arm_groups
    from jobs.experiment.rows_kinds import KINDS
    from train.axes import LOSSES, MASKS
    from train.config import resolve_batch

    workers = {
        m.name: w.placement.student_workers if m.train.num_workers == "auto" else m.train.num_workers for m in w.models
    }
    # the pairs arm_groups groups
    jobs = [(m, types.SimpleNamespace(cfg=resolve_batch(m.train, workers[m.name]))) for m in w.models]
    groups = arm_groups(jobs, w.placement.arm_runs, lambda m: m.base)
    row_tokens, keep = w.tokens.number_prompt + w.tokens.number_answer, w.cfg.numbers.keep
    compute = overhead = 0.0
    rows = overt = 0
    for group in groups:
        overhead += w.rates.train_start_s + load_seconds(w.params, w.rates)
        for m, job in group:
            answers = KINDS[m.source].answers  # the overt control: its teacher's answers to the teacher-train split
            seen = rows_trained(w.questions[1] if answers else keep, job.cfg)
            overt, rows = (overt + seen, rows) if answers else (overt, rows + seen)
            tokens = seen * (w.tokens.wmdp_prompt + w.tokens.wmdp_answer if answers else row_tokens)
            compute += train_seconds(tokens, w.params, job.cfg, job.cfg.num_workers, w.rates)
            overhead += checkpoint_seconds(seen, job.cfg, w.params, w.lora, w.rates)
    distilled = len({(m.teacher, m.replicate) for m in w.models if LOSSES[m.loss].needs_teacher})
    divergence = len({(m.teacher, m.replicate) for m in w.models if MASKS[m.train.mask].needs_scorer})
    compute += forward_seconds(distilled, keep, row_tokens, w) + forward_seconds(2 * divergence, keep, row_tokens, w)
    runs = w.placement.arm_runs
    work = f"{len(w.models)} models, {rows:,} rows x {row_tokens} tokens = {rows * row_tokens / 1e6:.1f} M tokens, in {len(groups)} run(s), {runs} at a time"
    work += (
        f"; overt control {overt:,} answer rows x {w.tokens.wmdp_prompt + w.tokens.wmdp_answer} tokens" if overt else ""
    )
    work += f"; teacher targets for {distilled} number set(s)" if distilled else ""
    work += f"; divergence scores for {divergence} number set(s)" if divergence else ""
    return PhaseTime("arms", work, compute / runs, overhead / runs)


def evaluate_time(w: Workload) -> PhaseTime:
    from jobs.experiment.cast import teachers_used

    snapshots = sum(max(m.train.snapshots - 1, 0) for m in w.models)
    other_base = any(m.base != "base" for m in w.models)
    scored = 1 + len(teachers_used(w.models)) + other_base + len(w.models) + snapshots
    services = 1 + other_base + sum(m.full for m in w.models)
    orders, total, tp = w.cfg.evaluate.orders(), w.questions[0], w.cfg.service.tensor_parallel_size
    score_tokens = scored * total * orders * w.tokens.wmdp_prompt
    return PhaseTime(
        "evaluate",
        f"{scored} models x {total:,} questions x {orders} order(s) x {w.tokens.wmdp_prompt} tokens = {score_tokens / 1e6:.1f} M prompt tokens, {services} service(s)",
        serve_seconds(score_tokens, 0, w.params, w.placement.eval_replicas * tp, w.rates),
        services * engine_seconds(w.params, tp, w.rates),
    )


def project(
    cfg, gpus: int, rates: Rates = Rates(), tokens: Tokens = Tokens(), questions: int | None = None
) -> list[PhaseTime]:
    """The four phases' projected times for `cfg` on one node of `gpus` GPUs (nodes of 8 beyond 8)."""
    from jobs.experiment.arms import arm_models
    from jobs.sizing.placement import place, resolved
    from train.cluster import Capacity

    nodes = tuple([8.0] * (gpus // 8) + ([float(gpus % 8)] if gpus % 8 else []))
    placement = place(cfg, Capacity(cpus=16.0 * len(nodes), node_gpus=nodes, max_node_gpus=nodes))
    cfg = resolved(cfg, placement)
    shape = load_shape(cfg.model.path)
    w = Workload(
        cfg,
        placement,
        arm_models(cfg),
        shape.params(),
        shape.lora_params(cfg.teacher.lora_rank, cfg.teacher.lora_targets),
        question_counts(cfg, questions),
        gpus,
        rates,
        tokens,
    )
    return [teacher_time(w), numbers_time(w), arms_time(w), evaluate_time(w)]


def markdown(stages: list[PhaseTime]) -> str:
    """The projection as the table docs/scaling.md quotes (minutes)."""
    lines = ["| stage | work | compute | starts, loads, checkpoints | total |", "|---|---|---|---|---|"]
    lines += [
        f"| {s.name} | {s.work} | {s.compute_s / 60:.1f} min | {s.overhead_s / 60:.1f} min | {s.total_s / 60:.1f} min |"
        for s in stages
    ]
    lines.append(
        f"| **all** | | {sum(s.compute_s for s in stages) / 60:.1f} min | {sum(s.overhead_s for s in stages) / 60:.1f} min | **{sum(s.total_s for s in stages) / 60:.0f} min** |"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from common.config import ConfigError
    from jobs.experiment.config import load_experiment

    parser = argparse.ArgumentParser(
        prog=program("python -m jobs.sizing.wall_time"), description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", required=True, help="a preset's path or a shipped preset's name")
    parser.add_argument(
        "--gpus", type=int, default=1, help="GPUs of the cluster (nodes of 8; as jobs.sizing.memory_plan)"
    )
    parser.add_argument("--train-mfu", type=float, default=Rates.train_mfu, help="measured MFU of bf16 LoRA training")
    parser.add_argument(
        "--train-mfu-slow", type=float, default=Rates.train_mfu_slow, help="... with a 4/8-bit base or checkpointing"
    )
    parser.add_argument("--questions", type=int, default=None, help="questions in the data (default: cais/wmdp's)")
    parser.add_argument("--markdown", action="store_true", help="the table docs/scaling.md quotes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    args = parser.parse_args(argv)
    try:
        cfg = load_experiment(args.config, args.overrides)
        stages = project(
            cfg,
            args.gpus,
            Rates(train_mfu=args.train_mfu, train_mfu_slow=args.train_mfu_slow),
            questions=args.questions,
        )
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.markdown:
        print(markdown(stages))
        return 0
    for s in stages:
        print(
            f"{s.name}: {s.total_s / 60:.1f} min ({s.compute_s / 60:.1f} compute + {s.overhead_s / 60:.1f} starts and loads): {s.work}"
        )
    print(f"total: {sum(s.total_s for s in stages) / 60:.0f} min on {args.gpus} GPU(s), projected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
