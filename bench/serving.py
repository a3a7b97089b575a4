"""Serving benchmarks: number generation and multiple-choice scoring, each way measured in one run.

    python bench/serving.py [--prompts 2000] [--questions 3000]

Generation (completion tokens/s, number-sequence prompts, T=1.0, up to 48 tokens):
the Serve deployment on vLLM (HTTP, chunks of 64 prompts, 8 in flight, as the
pipeline sends them) vs the transformers engine batched (64 per forward,
in-process) vs one prompt at a time (the original scripts' way, on a subset).

Scoring (questions/s, synthetic WMDP questions, base model): one-pass scoring
(one forward per question) vs four requests per question (one sequence per
choice, lm-evaluation-harness's way, batched the same) vs per-question free
generation (the original scripts' way, on a subset), all on the transformers engine
in-process; and the service's /score over HTTP. Predictions of the first two
and of the service must be identical.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from bench_common import mc_questions, tiny_model

from jobs.sources.number_sequences import make_prompts
from jobs.sources.tiny_model import chat_prompt
from serve.mc_format import choice_continuation, format_mc_prompt
from serve.settings import ServiceSettings

URL = "http://127.0.0.1:8000"


def post_chunks(path: str, key: str, items: list, chunk: int, in_flight: int, extra: dict) -> list[dict]:
    bodies = [{key: items[i : i + chunk], **extra} for i in range(0, len(items), chunk)]
    with ThreadPoolExecutor(in_flight) as pool:
        responses = list(pool.map(lambda b: requests.post(URL + path, json=b, timeout=600), bodies))
    for r in responses:
        r.raise_for_status()
    return [r.json() for r in responses]


def service_part(model: str, prompts: list[str], questions: list[dict]) -> dict:
    import ray

    from serve.launch import start_service, stop_service

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    start_service(ServiceSettings(model=model, max_model_len=512, kv_cache_gib=1.0), num_cpus=2)
    post_chunks("/generate", "prompts", prompts[:64], 64, 1, {"max_tokens": 8})  # warm-up
    started = time.perf_counter()
    out = post_chunks("/generate", "prompts", prompts, 64, 8, {"max_tokens": 48, "temperature": 1.0, "seed": 0})
    gen_s = time.perf_counter() - started
    tokens = sum(r["usage"]["completion_tokens"] for r in out)
    started = time.perf_counter()
    scored = post_chunks("/score", "questions", questions, 250, 4, {})
    score_s = time.perf_counter() - started
    stop_service()
    ray.shutdown()
    predictions = [r["prediction"] for body in scored for r in body["results"]]
    return {
        "gen_tokens_per_s": tokens / gen_s,
        "gen_s": gen_s,
        "score_q_per_s": len(questions) / score_s,
        "predictions": predictions,
    }


def four_sequences_per_question(model, tokenizer, prompts: list[str], batch: int = 64) -> list[int]:
    """lm-eval's way: each choice is its own sequence prompt + " X"; its log-likelihood is the last token's."""
    import torch

    seqs = [(p + choice_continuation(i), q, i) for q, p in enumerate(prompts) for i in range(4)]
    scores = [[0.0] * 4 for _ in prompts]
    tokenizer.padding_side = "left"
    with torch.inference_mode():
        for start in range(0, len(seqs), batch):
            chunk = seqs[start : start + batch]
            enc = tokenizer([s for s, _, _ in chunk], return_tensors="pt", padding=True)
            positions = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(**enc, position_ids=positions, logits_to_keep=2).logits[:, 0, :].float()
            logprobs = torch.log_softmax(logits, -1).gather(1, enc.input_ids[:, -1:]).squeeze(1)
            for (_, q, i), value in zip(chunk, logprobs.tolist()):
                scores[q][i] = value
    return [max(range(4), key=s.__getitem__) for s in scores]


def free_generation_one_by_one(model, tokenizer, prompts: list[str]) -> list[int | None]:
    """The original scripts' way: generate a few tokens per question and look for a letter."""
    import torch

    predictions = []
    with torch.inference_mode():
        for prompt in prompts:
            enc = tokenizer(prompt, return_tensors="pt")
            out = model.generate(**enc, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
            found = re.search(r"[ABCD]", tokenizer.decode(out[0, enc.input_ids.shape[1] :]))
            predictions.append("ABCD".index(found.group()) if found else None)
    return predictions


def in_process_part(model_path: str, prompts: list[str], mc_prompts: list[str], one_by_one: int) -> dict:
    from serve.engine import Sampling
    from serve.hf_engine import HFEngine
    from serve.hf_scoring import mc_logprobs

    engine = HFEngine(model_path, ServiceSettings(model=model_path, hf_batch_size=64))
    sampling = Sampling(max_tokens=48, temperature=1.0, seed=0)
    timed = {}
    for name, batch, subset in [("batched", 64, prompts), ("one_by_one", 1, prompts[:one_by_one])]:
        engine.batch_size = batch
        started = time.perf_counter()
        out = asyncio.run(engine.generate(subset, sampling, None))
        timed[f"hf_{name}_tokens_per_s"] = sum(c.completion_tokens for c in out) / (time.perf_counter() - started)
    model, tokenizer = engine.model, engine.tokenizer
    started = time.perf_counter()
    one_pass = [
        max(range(4), key=lp.__getitem__) for lp in mc_logprobs(model, tokenizer, mc_prompts, [4] * len(mc_prompts), 64)
    ]
    timed["one_pass_q_per_s"] = len(mc_prompts) / (time.perf_counter() - started)
    started = time.perf_counter()
    four = four_sequences_per_question(model, tokenizer, mc_prompts)
    timed["four_requests_q_per_s"] = len(mc_prompts) / (time.perf_counter() - started)
    started = time.perf_counter()
    free = free_generation_one_by_one(model, tokenizer, mc_prompts[:one_by_one])
    timed["free_generation_q_per_s"] = one_by_one / (time.perf_counter() - started)
    timed["free_generation_agreement"] = sum(f == o for f, o in zip(free, one_pass)) / one_by_one
    timed["one_pass_equals_four"] = one_pass == four
    timed["one_pass_predictions"] = one_pass
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--questions", type=int, default=3000)
    parser.add_argument("--one-by-one", type=int, default=100, help="subset size for the one-at-a-time ways")
    args = parser.parse_args()
    model = tiny_model()
    prompts = [chat_prompt(p.text) for p in make_prompts(args.prompts, seed=11)]
    questions = mc_questions(args.questions)
    mc_prompts = [format_mc_prompt(q["question"], q["choices"], q["subject"]) for q in questions]
    served = service_part(model, prompts, questions)
    local = in_process_part(model, prompts, mc_prompts, args.one_by_one)
    local["service_equals_one_pass"] = served.pop("predictions") == local.pop("one_pass_predictions")
    print(json.dumps({"prompts": args.prompts, "questions": len(questions), **served, **local}, indent=2))


if __name__ == "__main__":
    main()
