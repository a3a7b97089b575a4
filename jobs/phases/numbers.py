"""Phase 3, numbers: per replicate, teacher and base model (and the sham teacher, when an arm reads it)
continue number sequences through one service (the teacher also greedily, for arms on
`teacher_greedy`); the teacher's `teacher_replaced` numbers are made from its sampled ones after.

Prompts (jobs.sources.number_sequences.make_prompts, rendered with the tokenizer's
chat template as the paper did) go out in chunks, several requests in flight
per model, and the teacher's and the control's requests run at the same time,
so the engine batches them together. Prompt i samples with seed `seed + i`, and
completions are filtered in prompt order: the kept set does not depend on
timing. Sending stops once `keep` completions have passed the filter, and
pauses while the prompts in flight should bring them (enough_in_flight). A chunk
whose replica died is resent (same seeds) and waited for in its place, so a
lost replica changes neither the kept set nor the counts.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor, as_completed

from common.atomic import write_jsonl
from common.model_source import load_pretrained
from jobs.experiment.arms import numbers_seed
from jobs.experiment.cast import number_sets
from jobs.experiment.config import NumbersConfig
from jobs.experiment.records import AnswersOutputs, NumbersOutputs, ReplacedOutputs
from jobs.experiment.rows_kinds import KINDS, generator_of
from jobs.experiment.stages import SPLIT_FILES, answering_teacher, numbers_file, numbers_stage
from jobs.rundir.manifest import read_jsonl
from jobs.runtime.adapter_check import check_adapters_applied, probe_generation, probe_scores
from jobs.runtime.context import RunContext
from jobs.runtime.progress import ProgressLine
from jobs.runtime.service import result_or_resend, running_service
from jobs.sources.number_sequences import CUT_OFF, make_prompts, reject_reason
from serve.schemas import GenerateRequest


class NoNumbersError(RuntimeError):
    """No completion passed the filter: training a student on nothing would be meaningless."""


def number_prompts(tokenizer, cfg: NumbersConfig) -> list[str]:
    """The chat-formatted prompts, identical for teacher and control."""
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False, add_generation_prompt=True)
        for p in make_prompts(cfg.prompts, seed=cfg.seed)
    ]


def numbers_request(tokenizer, cfg, source: str, replicate: int) -> tuple[list[str], str | None, NumbersConfig]:
    """(prompts, adapter (None: the base model), settings) of a sampled source's replicate: its
    seed's prompts, at its kind's temperature where it sets one (greedy: 0)."""
    numbers = cfg.numbers.replace(seed=numbers_seed(cfg, replicate))
    if (temperature := KINDS[source].temperature) is not None:
        numbers = numbers.replace(temperature=temperature)
    return number_prompts(tokenizer, numbers), generator_of(source), numbers


def enough_in_flight(kept: int, pass_rate: float, prompts_in_flight: int, cfg: NumbersConfig) -> bool:
    """Whether the prompts in flight, at the pass rate seen so far, should bring `keep` with a chunk
    to spare. Sending past that only makes completions that arrive after `keep` and are thrown
    away: with 8 chunks of 64 in flight, a quarter of the tiny preset's sequences. The kept rows
    do not depend on it (the first `keep` to pass, in prompt order): a short guess costs one
    more round trip, never another result."""
    return kept + pass_rate * (prompts_in_flight - cfg.chunk) >= cfg.keep


def generate_kept(handle, prompts: list[str], adapter: str | None, cfg: NumbersConfig, label: str) -> dict:
    """Send prompts until `keep` pass the filter; returns rows to train on and the counts for the report."""
    starts = list(range(0, len(prompts), cfg.chunk))
    pending: deque = deque()
    kept: list[dict] = []
    rejected: Counter = Counter()
    generated, examined, started, next_chunk, progress = 0, 0, time.time(), 0, ProgressLine()
    while pending or (next_chunk < len(starts) and len(kept) < cfg.keep):
        while next_chunk < len(starts) and len(pending) < cfg.in_flight and len(kept) < cfg.keep:
            if examined and enough_in_flight(
                len(kept), len(kept) / examined, sum(len(r.prompts) for _, r, _ in pending), cfg
            ):
                break
            start = starts[next_chunk]
            request = GenerateRequest(
                prompts=prompts[start : start + cfg.chunk],
                max_tokens=cfg.max_tokens,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                seed=cfg.seed * 1_000_003 + start,
                adapter=adapter,
            )
            pending.append((start, request, handle.generate.remote(request)))
            next_chunk += 1
        start, request, response = pending.popleft()
        completions = result_or_resend(handle.generate, request, response, f"{label} prompts {start}+").completions
        generated += len(completions)
        if len(kept) >= cfg.keep:
            continue  # already enough: results still in flight are counted, not filtered
        examined += len(completions)
        for i, completion in enumerate(completions):
            reason = CUT_OFF if completion.finish_reason == "length" else reject_reason(completion.text)
            if reason:
                rejected[reason] += 1
            elif len(kept) < cfg.keep:
                kept.append({"prompt": prompts[start + i], "completion": completion.text})
        rate = generated / max(time.time() - started, 1e-9)
        last = len(kept) >= cfg.keep or (not pending and next_chunk == len(starts))
        progress.print(
            f"[numbers] {label}: {generated}/{len(prompts)} generated, {len(kept)} kept, {rate:.0f} sequences/s",
            final=last,
        )
    if not kept:
        raise NoNumbersError(f"no {label} completion passed the number filter; reject reasons: {dict(rejected)}")
    return {"rows": kept, "generated": generated, "kept": len(kept), "rejected": dict(rejected)}


def generate_all(handle, requests: dict[str, tuple[list[str], str | None, NumbersConfig]]):
    """Generate every named request at once through one service: name -> (prompts, adapter
    (None = base model), settings with that request's seed). Yields (name, result) as each
    finishes, so a caller can store it at once; a request whose completions all failed the
    filter yields its NoNumbersError as the result, after which the others still finish."""
    with ThreadPoolExecutor(len(requests)) as pool:
        futures = {
            pool.submit(generate_kept, handle, prompts, adapter, cfg, name): name
            for name, (prompts, adapter, cfg) in requests.items()
        }
        for future in as_completed(futures):
            try:
                yield futures[future], future.result()
            except NoNumbersError as err:
                yield futures[future], err


def teacher_answers(handle, teacher: str, questions: list[dict], ctx: RunContext) -> dict:
    """The overt positive control's rows: each train question in the teacher's training format,
    completed by the choice `teacher` picks (scored as the evaluation scores, in its format), not
    by the answer key. What the arm then learns is the teacher's knowledge, errors included."""
    from jobs.phases.data import mc_rows
    from jobs.phases.evaluate import score_models

    cfg = ctx.cfg.evaluate
    picked = score_models(handle, {teacher: teacher}, questions, cfg.chunk, ctx.cfg.numbers.in_flight, 1, cfg.format)[
        teacher
    ]
    rows = mc_rows([{**q, "answer": q["prediction"]} for q in picked], format=cfg.format)
    right = sum(q["prediction"] == q["answer"] for q in picked)
    print(
        f"[numbers] answers/{teacher}: {len(rows)} train questions answered, {right / len(rows):.3f} of them right",
        flush=True,
    )
    return {"rows": rows, "kept": len(rows), "right": right}


def run(ctx: RunContext, todo) -> None:
    """Every (source, replicate) still to make, through one service, all at once, with the teachers'
    answers an overt positive control trains on (answers/<teacher>); then, the service gone, each
    rewritten kind (the teacher's replaced numbers) from what it derives from, by its maker (`REWRITERS`)."""
    from transformers import AutoTokenizer

    tokenizer = load_pretrained(AutoTokenizer, ctx.model_path)
    sets = {numbers_stage(source, i): (source, i) for source, i in number_sets(list(ctx.models.values()))}
    answering = [(stage, teacher) for stage in todo if (teacher := answering_teacher(stage))]
    todo = [stage for stage in todo if not answering_teacher(stage)]
    rewriting = [stage for stage in todo if KINDS[sets[stage.name][0]].made == "rewritten"]
    requests = {
        stage.name: numbers_request(tokenizer, ctx.cfg, *sets[stage.name]) for stage in todo if stage not in rewriting
    }
    if requests or answering:
        generate_through_service(ctx, todo, requests, answering)
    for stage in rewriting:  # after the service: a scoring pass takes its resources
        source, replicate = sets[stage.name]
        REWRITERS[source](ctx, stage, replicate)


def generate_through_service(ctx: RunContext, todo, requests: dict, answering: list) -> None:
    """The numbers `requests` and the teachers' answers, through one service, all at once."""
    generating = {a: str(ctx.trained(a)) for _, a, _ in requests.values() if a}
    answerers = {t: str(ctx.trained(t)) for _, t in answering}
    errors = []
    with running_service(
        ctx.app, ctx.model_path, {**generating, **answerers}, ctx.cfg, False, ctx.lora_rank, ctx.span
    ) as handle:
        check_adapters_applied(handle, generating, lambda adapter: probe_generation(handle, adapter))
        check_adapters_applied(
            handle, answerers, lambda adapter: probe_scores(handle, adapter, ctx.cfg.evaluate.format)
        )
        started = time.time()
        if answering:
            questions = read_jsonl(ctx.run_dir / "data" / SPLIT_FILES["train"])
        for stage, teacher in answering:
            result = teacher_answers(handle, teacher, questions, ctx)
            file_hash = write_jsonl(ctx.run_dir / stage.files[0], result.pop("rows"))
            ctx.record(stage, started, AnswersOutputs(**result, hash=file_hash))
        for name, result in generate_all(handle, requests) if requests else ():
            if isinstance(result, NoNumbersError):
                errors.append(result)
                continue
            stage = next(s for s in todo if s.name == name)
            file_hash = write_jsonl(ctx.run_dir / stage.files[0], result.pop("rows"))
            ctx.record(stage, started, NumbersOutputs(**result, hash=file_hash))
    if errors:
        raise errors[0]


def replace_numbers(ctx: RunContext, stage, replicate: int) -> None:
    """numbers/teacher_replaced/<i>: the teacher's kept numbers of replicate i, their most divergent
    tokens replaced by the base's argmax (jobs/sources/replaced_numbers.py), in a Ray task of its
    own (a GPU where the students train on GPUs)."""
    import ray

    from jobs.sources.replaced_numbers import replace_divergent

    started = time.time()
    rows = read_jsonl(ctx.run_dir / numbers_file("teacher", replicate))
    gpu = ctx.cfg.student.use_gpu
    task = ray.remote(num_cpus=0 if gpu else 1, num_gpus=1 if gpu else 0)(replace_divergent)
    teacher = str(ctx.trained("teacher"))
    result = ray.get(
        task.remote(
            rows, ctx.model_path, teacher, ctx.cfg.numbers.replace_fraction, ctx.cfg.student, ctx.cfg.student.max_length
        )
    )
    if not result["rows"]:
        raise NoNumbersError(
            f"no replaced row of numbers/teacher/{replicate} passed the number filter; reject reasons: {result['rejected']}"
        )
    file_hash = write_jsonl(ctx.run_dir / stage.files[0], result.pop("rows"))
    print(
        f"[numbers] {stage.name}: {result['tokens_replaced']} tokens replaced in {result['generated']} rows, {result['kept']} kept"
        f" ({sum(result['rejected'].values())} failed the filter)",
        flush=True,
    )
    ctx.record(stage, started, ReplacedOutputs(**result, hash=file_hash))


REWRITERS = {"teacher_replaced": replace_numbers}  # the maker of each rewritten kind (jobs/experiment/rows_kinds.py)
