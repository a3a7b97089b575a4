"""Phase 5, evaluate: every model scored on the train and held-out questions, in parallel.

One service per base model (the other base's after the teacher's) serves the
base itself and the adapters over it: teachers, arm models and the earlier
snapshots of arms that keep them (transfer against training steps). A fully
fine-tuned arm model is a model of its own: a service of its own after those. Work is
split by (model, chunk of questions) and sent concurrently, so the service's
replicas share it (one per GPU on GPU clusters); a chunk whose replica died is
resent. Scoring is the service's one-pass `/score`; with `evaluate.permutations`
k > 1, every question is also scored with its choices in k - 1 more cyclic
orders and the log-probabilities, mapped back to the original choices, are
averaged, so a prior over answer letters cannot pass for knowledge. Accuracy
and the transfer statistics are computed from the stored rows by the report
(jobs/stats/).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from common.atomic import write_jsonl
from common.config import ConfigError
from common.model_source import load_pretrained
from jobs.experiment.cast import earlier_snapshots
from jobs.experiment.records import EvalOutputs
from jobs.experiment.stages import PROBES_FILE, SPLIT_FILES, TEACHERS, scored_file, scored_model
from jobs.rundir.manifest import digest, read_jsonl
from jobs.runtime.adapter_check import check_adapters_applied, probe_scores
from jobs.runtime.context import RunContext
from jobs.runtime.progress import ProgressLine
from jobs.runtime.service import result_or_resend, running_service, service_settings
from jobs.stats.accuracy import on_split, summarise
from serve.schemas import Question, ScoreRequest


def rotated(q: Question, order: int) -> Question:
    """The question with its choices in cyclic order `order`: the choice shown as letter j is the
    original choice (j + order) mod n; order 0 is the question as written."""
    r = order % len(q.choices)
    answer = None if q.answer is None else (q.answer - r) % len(q.choices)
    return Question(question=q.question, choices=q.choices[r:] + q.choices[:r], answer=answer, subject=q.subject)


def unrotated(logprobs: list[float], order: int) -> list[float]:
    """A rotated question's log-probabilities (by letter shown), back on the original choices."""
    n = len(logprobs)
    return [logprobs[(i - order) % n] for i in range(n)]


def over_orders(results: list) -> dict:
    """One question's scores in every order (ScoreResults, order 0 first) as one row's fields: the
    log-probabilities mapped back and averaged, the prediction their argmax, and the choice each
    order picked (`order_predictions`, for the letter prior)."""
    per_order = [unrotated(r.logprobs, order) for order, r in enumerate(results)]
    mean = [sum(values) / len(per_order) for values in zip(*per_order)]
    picks = [max(range(len(lp)), key=lp.__getitem__) for lp in per_order]
    return {
        "prediction": max(range(len(mean)), key=mean.__getitem__),
        "logprobs": mean,
        "truncated_tokens": max(r.truncated_tokens for r in results),
        "order_predictions": picks,
    }


def score_models(
    handle,
    models: dict[str, str | None],
    questions: list[dict],
    chunk: int,
    in_flight: int,
    orders: int = 1,
    format: str = "letters",
) -> dict[str, list[dict]]:
    """Per model (name -> adapter, None = base), the questions with `prediction`, `logprobs` and
    `truncated_tokens` (prompt tokens cut from the left to fit the context, lm-evaluation-harness's rule)
    added; with `orders` > 1, each question scored in that many cyclic orders of its choices (over_orders)."""
    body = [
        Question(question=q["question"], choices=q["choices"], answer=q["answer"], subject=q["subset"])
        for q in questions
    ]
    bodies = [body] + [[rotated(q, order) for q in body] for order in range(1, orders)]
    jobs = [
        (name, order, start) for name in models for order in range(orders) for start in range(0, len(questions), chunk)
    ]
    total, started, done, lock, progress = (
        len(questions) * len(models) * orders,
        time.time(),
        [0],
        threading.Lock(),
        ProgressLine(),
    )

    def score(job):
        name, order, start = job
        request = ScoreRequest(
            questions=bodies[order][start : start + chunk], adapter=models[name], truncate=True, format=format
        )  # a long question never fails the stage
        label = f"{name} questions {start}+" + (f" (order {order})" if order else "")
        results = result_or_resend(handle.score, request, handle.score.remote(request), label).results
        with lock:
            done[0] += len(results)
            progress.print(
                f"[evaluate] {done[0]}/{total} scored, {done[0] / (time.time() - started):.0f} questions/s",
                final=done[0] == total,
            )
        return results

    with ThreadPoolExecutor(in_flight) as pool:
        answers = list(pool.map(score, jobs))
    by_order: dict[tuple[str, int], list] = {}
    for (name, order, _), results in zip(jobs, answers):
        by_order.setdefault((name, order), []).extend(results)
    scored: dict[str, list[dict]] = {}
    for name in models:
        per_question = zip(*(by_order[name, order] for order in range(orders)))
        if orders == 1:
            scored[name] = [
                {**q, "prediction": r.prediction, "logprobs": r.logprobs, "truncated_tokens": r.truncated_tokens}
                for q, (r,) in zip(questions, per_question)
            ]
        else:
            scored[name] = [{**q, **over_orders(list(results))} for q, results in zip(questions, per_question)]
    return scored


def check_orders(questions: list[dict], orders: int) -> None:
    """evaluate.permutations must not exceed the fewest choices a question has (orders would repeat)."""
    fewest = min(len(q["choices"]) for q in questions)
    if orders > fewest:
        raise ConfigError(
            f"evaluate.permutations {orders} exceeds the fewest choices a question has ({fewest}): cyclic orders would repeat"
        )


def context_check(model_path: str, questions: list[dict], max_model_len: int, format: str = "letters") -> str:
    """One line on whether every question's prompt fits the scoring context, measured with the
    model's tokenizer before any model is loaded: prompts that do not fit are scored
    left-truncated (`truncated_tokens` in the eval rows), never failing the stage."""
    from transformers import AutoTokenizer

    from serve.mc_format import cloze_continuation, format_cloze_prompt, format_mc_prompt

    tokenizer = load_pretrained(AutoTokenizer, model_path)
    if format == "cloze":  # room for the longest choice's text
        prompts = [format_cloze_prompt(q["question"], q["subset"]) for q in questions]
        room = [
            max(len(tokenizer(cloze_continuation(c), add_special_tokens=False).input_ids) for c in q["choices"])
            for q in questions
        ]
    else:  # one token of room for the answer letter
        prompts, room = (
            [format_mc_prompt(q["question"], q["choices"], q["subset"]) for q in questions],
            [1] * len(questions),
        )
    lengths = [len(ids) for ids in tokenizer(prompts, add_special_tokens=True).input_ids]
    over = sum(n > max_model_len - r for n, r in zip(lengths, room))
    line = f"longest question prompt {max(lengths)} tokens (service.max_model_len {max_model_len})"
    return line + (
        f": {over} of {len(lengths)} questions will be scored left-truncated, as lm-evaluation-harness does"
        if over
        else ": all fit"
    )


def scoring_targets(ctx: RunContext, base: str, names: list[str], snapshots: dict) -> tuple[dict, dict]:
    """({scored name: adapter or None for the base itself}, {adapter: folder}) of the models over
    `base` ("base" or "other_base"): the base, its LoRA adapters, and the earlier snapshots of
    arms that keep them (fully fine-tuned arm models: `services`)."""
    targets, adapters = {}, {}
    for n in names:
        if n == base:
            targets[n] = None
        elif n in TEACHERS and base == "base":
            targets[n], adapters[n] = n, str(ctx.trained(n))
        elif n in ctx.models and ctx.models[n].base == base and not ctx.models[n].full:
            m = ctx.models[n]
            targets[n], adapters[m.adapter] = m.adapter, str(ctx.trained(n))
            for step, scored_name in snapshots[n]:  # earlier snapshots, for transfer against training steps
                targets[scored_name] = f"{m.adapter}-step{step}"
                adapters[targets[scored_name]] = str(ctx.trained(n) / "snapshots" / f"step-{step}")
    return targets, adapters


def services(ctx: RunContext, names: list[str], snapshots: dict) -> list[tuple[str, dict, dict, dict]]:
    """(base model folder, {scored name: adapter or model name, None for the base}, {adapter: folder},
    {model: folder}) of each Serve application the models in `names` need: one per base, whose
    transformers engine also holds the fully fine-tuned arm models of that base; on vLLM, which
    serves one model per application, each fully fine-tuned model has an application of its own."""
    from serve.engine import ENGINES
    from serve.engine_choice import engine_kinds

    full = [n for n in names if n in ctx.models and ctx.models[n].full]
    settings = service_settings(ctx.cfg, ctx.model_path, True, ctx.lora_rank)
    beside_base = all(
        ENGINES[k].serves_full_models_beside_base
        for k in engine_kinds(settings, bool(ctx.cfg.evaluate.gpus_per_replica))
    )
    apps = []
    for base, path in ctx.paths.items():
        targets, adapters = scoring_targets(ctx, base, names, snapshots)
        models = {
            ctx.models[n].adapter: str(ctx.trained(n)) for n in full if beside_base and ctx.models[n].base == base
        }
        targets.update({n: ctx.models[n].adapter for n in full if ctx.models[n].adapter in models})
        apps.append((path, targets, adapters, models))
    return apps + [(str(ctx.trained(n)), {n: None}, {}, {}) for n in full if not beside_base]


def question_sets(ctx: RunContext) -> list[tuple[list[dict], str]]:
    """(questions, the format they are scored in) of every set each model is scored on: the splits'
    questions in the run's format, each row carrying its split; with evaluate.probes, the probe rows
    too (each with its own split), the swapped questions as the run's questions and the statements
    as continuations of their own text (no question frame: jobs/sources/world_probes.py)."""
    fmt = ctx.cfg.evaluate.format
    questions = [
        {**q, "split": split} for split, file in SPLIT_FILES.items() for q in read_jsonl(ctx.run_dir / "data" / file)
    ]
    if not ctx.cfg.evaluate.probes:
        return [(questions, fmt)]
    probes = read_jsonl(ctx.run_dir / PROBES_FILE)
    statements = [q for q in probes if q["probe"] == "statement"]
    return [(questions + [q for q in probes if q["probe"] == "swap"], fmt), (statements, "continuation")]


def run(ctx: RunContext, todo) -> None:
    """Every model still to score, with its earlier snapshots; each stage recorded with its held-out accuracy."""
    started = time.time()
    names = [scored_model(stage) for stage in todo]
    snapshots = {n: earlier_snapshots(ctx.manifest, n) for n in names if n in ctx.models}
    sets, evaluate = question_sets(ctx), ctx.cfg.evaluate
    scored: dict[str, list[dict]] = {}
    for model_path, targets, adapters, models in services(ctx, names, snapshots):
        if targets:
            with running_service(
                ctx.app, model_path, adapters, ctx.cfg, True, ctx.lora_rank, ctx.span, models
            ) as handle:
                check_adapters_applied(handle, adapters, lambda adapter: probe_scores(handle, adapter, evaluate.format))
                for questions, fmt in sets:
                    orders = evaluate.orders() if fmt == evaluate.format else 1
                    for name, rows in score_models(
                        handle, targets, questions, evaluate.chunk, 2 * evaluate.replicas, orders, fmt
                    ).items():
                        scored.setdefault(name, []).extend(rows)
    for stage, name in zip(todo, names):
        earlier = [scored_name for _, scored_name in snapshots.get(name, [])]
        hashes = [write_jsonl(ctx.run_dir / scored_file(n), scored[n]) for n in earlier]
        file_hash = write_jsonl(ctx.run_dir / scored_file(name), scored[name])
        outputs = EvalOutputs(
            hash=digest(file_hash, *hashes) if hashes else file_hash,
            **summarise(on_split(scored[name], "held_out")).dump(),
        )
        ctx.record(stage, started, outputs, [scored_file(n) for n in earlier])
