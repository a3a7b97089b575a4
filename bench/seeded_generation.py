"""Seeded generation on the transformers engine: batched per-row generators vs one prompt at a time.

    python bench/seeded_generation.py [--prompts 256]

The numbers stage generates every sequence seeded (prompt i from seed + i). The
engine used to keep that contract by sampling seeded prompts one at a time; it
now decodes them in batches of `hf_batch_size` with a generator per row
(serve/hf_decode.py). One run times, on the same chat number prompts (48 tokens,
temperature 1, in-process, the tiny model):

- seeded, batches of 64 (the engine now);
- unseeded, batches of 64 (the same decoder on the global random stream);
- seeded, one prompt at a time (`hf_batch_size=1`: the engine's former path);
- transformers' `generate`, batches of 64, unseeded (the engine's former unseeded path).

and checks that the seeded rows gave the same texts batched and one by one.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from bench_common import tiny_model

from jobs.experiment.config import NumbersConfig
from jobs.phases.numbers import number_prompts
from serve.engine import Sampling
from serve.hf_engine import HFEngine
from serve.settings import ServiceSettings


def run(engine: HFEngine, prompts: list[str], s: Sampling, batch_size: int) -> tuple[float, list]:
    engine.batch_size = batch_size
    start = time.perf_counter()
    completions = asyncio.run(engine.generate(prompts, s, None))
    return time.perf_counter() - start, completions


def transformers_generate(engine: HFEngine, prompts: list[str], s: Sampling) -> tuple[float, int]:
    tok = engine.tokenizer
    start, tokens = time.perf_counter(), 0
    with torch.inference_mode():
        for i in range(0, len(prompts), 64):
            enc = tok(prompts[i : i + 64], return_tensors="pt", padding=True)
            out = engine.model.generate(
                **enc,
                max_new_tokens=s.max_tokens,
                do_sample=True,
                top_k=0,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            new = out[:, enc.input_ids.shape[1] :]
            tokens += int(((new != tok.pad_token_id).cumprod(1)).sum())  # up to each row's end of sequence
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=256)
    args = parser.parse_args()
    path = tiny_model()
    engine = HFEngine(path, ServiceSettings(engine="hf", model=path))
    prompts = number_prompts(engine.tokenizer, NumbersConfig(prompts=args.prompts, seed=0))
    seeded, unseeded = Sampling(max_tokens=48, temperature=1.0, seed=0), Sampling(max_tokens=48, temperature=1.0)
    run(engine, prompts[:64], seeded, 64)  # warm-up
    rows = {}
    for name, s, batch_size in [
        ("seeded, batches of 64", seeded, 64),
        ("unseeded, batches of 64", unseeded, 64),
        ("seeded, one at a time", seeded, 1),
    ]:
        seconds, completions = run(engine, prompts, s, batch_size)
        rows[name] = (seconds, sum(c.completion_tokens for c in completions), [c.text for c in completions])
    seconds, tokens = transformers_generate(engine, prompts, unseeded)
    rows["transformers generate, batches of 64, unseeded"] = (seconds, tokens, None)
    one_by_one = rows["seeded, one at a time"][0]
    print(f"{len(prompts)} prompts x up to 48 tokens, T=1.0\n")
    print("| way | seconds | completion tokens/s | vs seeded one at a time |\n|---|---|---|---|")
    for name, (seconds, tokens, _) in rows.items():
        print(f"| {name} | {seconds:.1f} | {tokens / seconds:,.0f} | {one_by_one / seconds:.2f}x |")
    same = rows["seeded, batches of 64"][2] == rows["seeded, one at a time"][2]
    print(f"\nseeded texts batched == one at a time: {same}")
    engine.shutdown()


if __name__ == "__main__":
    main()
