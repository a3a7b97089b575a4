"""`8b_scoring`: the transformers engine's batched scoring and generation at full 8B depth.

Why: on GPU the pipeline scores and generates with vLLM, whose rates docs/scaling.md assumes
(prefill MFU 0.5, decode 0.12) because vLLM cannot be carried to a bare GPU machine. The
transformers engine (serve/hf_engine.py) is the fallback where vLLM is missing and the reference
vLLM is tested against; its rates here are measured floors under those assumptions, through the
engine's own `score` and `generate`. Its scoring left-pads a batch and moves position ids past
the padding: in float32 on the GPU's kernels (TF32 off), each prompt's choice log-probabilities in
a batch must match the same prompt scored alone (a padding or position bug moves them by whole
nats). In the engine's bf16 the same comparison is reported beside bf16's own rounding (bf16 vs
float32, each prompt alone), which it cannot be held to a fixed bound against: on the first H100
run, at a 0.05-nat bound set beforehand, bf16 batched vs alone differed by up to 0.23 nats.

Prompts are synthetic WMDP-format questions behind a filler passage, 100-400 tokens (mean ~250,
docs/scaling.md's WMDP prompt), and the tiny preset's number prompts, all tokenised by the tiny
preset's tokenizer (ids < 1,024: valid in the 8B vocabulary). Weights are random: the figures are
speed and agreement, not accuracy. In --smoke the tiny preset's own model stands in, on CPU.
"""

from __future__ import annotations

import asyncio
import math
import random
import shutil
import statistics
from pathlib import Path

from jobs.sources.number_sequences import make_prompts
from jobs.sources.tiny_model import chat_prompt, ensure_tiny_model
from jobs.sources.wmdp import synthetic_questions
from serve.engine import Sampling
from serve.hf_engine import HFEngine
from serve.hf_scoring import mc_logprobs_batch
from serve.mc_format import format_mc_prompt
from serve.settings import ServiceSettings
from train.step import peak_flops

from .shared import Context, clock, peak_gib, reset_peak

SCORE_BATCH = 64  # the engine's default hf_batch_size
GENERATE_BATCH = 256
ALONE = 32  # prompts also scored one at a time
FLOAT32_AGREEMENT_NATS = 1e-3  # float32 on CPU: 5e-6


def check_8b_scoring(ctx: Context, model_path: str | None, questions: int, generations: int) -> dict:
    tokenizer_source = str(ensure_tiny_model())
    folder = tokenizer_source if model_path is None else with_tokenizer(model_path, tokenizer_source)
    engine = HFEngine(folder, ServiceSettings(model=folder, engine="hf", hf_batch_size=SCORE_BATCH))
    n_params = sum(p.numel() for p in engine.model.parameters())
    peak = peak_flops(ctx.device)
    prompts = wmdp_prompts(questions, engine.tokenizer)
    prompt_tokens = sum(engine.count_tokens(prompts))
    asyncio.run(engine.score(prompts[:SCORE_BATCH], [4] * SCORE_BATCH, None))  # warm-up: kernel selection
    reset_peak(ctx.device)
    started = clock(ctx.device)
    scores = asyncio.run(engine.score(prompts, [4] * len(prompts), None))
    score_s = clock(ctx.device) - started
    score_peak = peak_gib(ctx.device)
    normalised = all(abs(sum(math.exp(x) for x in row) - 1) < 1e-3 for row in scores)

    number_prompts = [chat_prompt(p.text) for p in make_prompts(generations, seed=0)]
    sampling = Sampling(max_tokens=22, temperature=1.0, seed=0)  # docs/scaling.md: ~22 tokens an answer
    engine.batch_size = GENERATE_BATCH  # the setting the engine read from hf_batch_size
    asyncio.run(engine.generate(number_prompts[:GENERATE_BATCH], sampling, None))
    reset_peak(ctx.device)
    started = clock(ctx.device)
    completions = asyncio.run(engine.generate(number_prompts, sampling, None))
    generate_s = clock(ctx.device) - started
    decoded = sum(c.completion_tokens for c in completions)
    number_prompt_tokens = sum(c.prompt_tokens for c in completions)
    agreement = padding_agreement(engine, prompts[:ALONE])
    engine.shutdown()
    return {
        "parameters": n_params,
        "dtype": str(engine.model.dtype),
        "scoring": {
            "questions": len(prompts),
            "batch": SCORE_BATCH,
            "mean_prompt_tokens": prompt_tokens / len(prompts),
            "seconds": score_s,
            "questions_per_s": len(prompts) / score_s,
            "prompt_tokens_per_s": prompt_tokens / score_s,
            "prefill_mfu": 2 * n_params * prompt_tokens / score_s / peak if peak else None,
            "peak_memory_gib": score_peak,
            "rows_sum_to_one": normalised,
        },
        "batched_vs_alone": agreement,
        "generation": {
            "prompts": len(number_prompts),
            "batch": GENERATE_BATCH,
            "mean_prompt_tokens": number_prompt_tokens / len(completions),
            "decoded_tokens": decoded,
            "seconds": generate_s,
            "decoded_tokens_per_s": decoded / generate_s,
            "decode_mfu": 2 * n_params * decoded / generate_s / peak if peak else None,
            "peak_memory_gib": peak_gib(ctx.device),
        },
        "ok": normalised and agreement["float32_batched_vs_alone_nats"] <= FLOAT32_AGREEMENT_NATS and decoded > 0,
    }


def padding_agreement(engine: HFEngine, prompts: list[str]) -> dict:
    """Worst gaps (nats) between `prompts` scored as one left-padded batch and each alone, in the
    engine's dtype and in float32 with TF32 off, and between the two dtypes alone (rounding)."""
    import torch

    model, dtype = engine.model, engine.model.dtype

    def scored(batch: list[str]) -> list[list[float]]:
        return mc_logprobs_batch(model, engine.tokenizer, batch, [4] * len(batch), engine.letters)

    def worst(a: list[list[float]], b: list[list[float]]) -> float:
        return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))

    native_batched, native_alone = scored(prompts), [scored([p])[0] for p in prompts]
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        model.float()
        f32_batched, f32_alone = scored(prompts), [scored([p])[0] for p in prompts]
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        model.to(dtype)
    return {
        "prompts": len(prompts),
        "engine_dtype": str(dtype),
        "float32_batched_vs_alone_nats": worst(f32_batched, f32_alone),
        "tolerance_nats": FLOAT32_AGREEMENT_NATS,
        "engine_dtype_batched_vs_alone_nats": worst(native_batched, native_alone),
        "engine_dtype_vs_float32_alone_nats": worst(native_alone, f32_alone),
        "letter_spread_nats": statistics.mean(max(r) - min(r) for r in f32_alone),  # the scale the gaps compare to
    }


def with_tokenizer(model_path: str, tokenizer_source: str) -> str:
    """`model_path` with the tiny preset's tokenizer files beside its weights, as a served model has."""
    for f in Path(tokenizer_source).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, Path(model_path) / f.name)
    return model_path


def wmdp_prompts(n: int, tokenizer) -> list[str]:
    """`n` WMDP-format prompts whose lengths spread over 100-400 tokens: each question behind a
    passage made of other questions' text, cut to a drawn length."""
    rows = synthetic_questions(n_per_subset=max(1, n // 3 + 1), seed=5)[:n]
    filler = " ".join(r["question"] for r in rows)
    filler_ids = tokenizer(filler, add_special_tokens=False).input_ids
    rng = random.Random(0)
    out = []
    for r in rows:
        prompt = format_mc_prompt(r["question"], r["choices"], r["subset"])
        extra = max(0, rng.randint(100, 400) - len(tokenizer(prompt).input_ids))
        start = rng.randint(0, max(0, len(filler_ids) - extra))
        out.append(tokenizer.decode(filler_ids[start : start + extra]) + "\n\n" + prompt)
    return out
