"""The engines' seed contract (serve/engine.py): prompt i of a seeded request samples from seed + i,
so a prompt's completion does not depend on the other prompts in its request or on the batch size.

Checked on the transformers engine directly (no Ray), against transformers' own `generate` run on
each prompt alone; tests/serve/test_serve.py checks the contract over HTTP on both engines (vLLM keeps it
through its per-request `SamplingParams.seed`).
"""

import asyncio

import pytest
import torch

from serve.engine import Sampling
from serve.settings import ServiceSettings


@pytest.fixture(scope="module")
def hf_engine(tiny_model):
    from serve.hf_engine import HFEngine

    return HFEngine(tiny_model, ServiceSettings(engine="hf", model=tiny_model, max_model_len=256))


PROMPTS = [
    "<|user|>\nContinue: 3, 14, 15\n<|assistant|>\n",
    "<|user|>\nContinue the sequence 9, 2, 6, 5, 3, 5, 8, 9, 7 with ten more numbers, comma-separated.\n<|assistant|>\n",
    "hello",
    "<|user|>\nWrite 5 numbers.\n<|assistant|>\n",
    "<|user|>\nHere are numbers: 100, 200, 300. Add up to 10 new numbers.\n<|assistant|>\n",
]


def generate_alone(engine, prompt: str, s: Sampling, seed: int | None) -> str:
    """transformers' `generate` on one prompt, seeded through the global stream: the reference."""
    enc = engine.tokenizer([prompt], return_tensors="pt")
    sampling = (
        {"do_sample": True, "temperature": s.temperature, "top_p": s.top_p, "top_k": 0}
        if s.temperature > 0
        else {"do_sample": False}
    )
    if seed is not None:
        torch.manual_seed(seed)
    out = engine.model.generate(
        **enc,
        max_new_tokens=s.max_tokens,
        pad_token_id=engine.tokenizer.pad_token_id,
        eos_token_id=engine.tokenizer.eos_token_id,
        **sampling,
    )
    return engine._completion(out[0, enc.input_ids.shape[1] :].tolist(), 0, s, engine.tokenizer.eos_token_id).text


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(max_tokens=24, temperature=1.0, seed=7),
        Sampling(max_tokens=24, temperature=0.7, top_p=0.9, seed=3),
        Sampling(max_tokens=24, temperature=0.0),
    ],
    ids=["seeded", "seeded-top-p", "greedy"],
)
def test_a_batch_decodes_what_generate_gives_each_prompt_alone(hf_engine, sampling):
    """Left-padded batches of any size give each prompt what `generate` gives it alone (seeded with
    seed + i): the batched sampler changes the speed, not the samples."""
    reference = [
        generate_alone(hf_engine, p, sampling, None if sampling.seed is None else sampling.seed + i)
        for i, p in enumerate(PROMPTS)
    ]
    for batch_size in (1, 2, 64):
        hf_engine.batch_size = batch_size
        try:
            got = [c.text for c in asyncio.run(hf_engine.generate(PROMPTS, sampling, None))]
        finally:
            hf_engine.batch_size = 64
        assert got == reference, batch_size


def texts(engine, prompts: list[str], seed: int | None) -> list[str]:
    completions = asyncio.run(engine.generate(prompts, Sampling(max_tokens=16, temperature=1.0, seed=seed), None))
    return [c.text for c in completions]


def test_a_seeded_prompt_samples_the_same_whatever_its_request_holds(hf_engine):
    prompts = [
        "<|user|>\nContinue: 3, 14, 15\n<|assistant|>\n",
        "<|user|>\nContinue: 9, 2, 6\n<|assistant|>\n",
        "hello",
    ]
    together = texts(hf_engine, prompts, seed=7)
    alone = [texts(hf_engine, [prompt], seed=7 + i)[0] for i, prompt in enumerate(prompts)]
    assert together == alone
    assert texts(hf_engine, prompts[1:], seed=8) == together[1:]  # shifted by one: seeds shift with it
    assert texts(hf_engine, prompts, seed=70) != together  # and the seed does matter


def test_token_id_prompts_sample_as_text_prompts_do(hf_engine):
    """complete_tokens (the OpenAI routes) samples what generate does for the same tokens, seeded
    (prompt i from seed + i) and greedy in batches."""
    prompts = ["<|user|>\nContinue: 3, 14, 15\n<|assistant|>\n", "hello"]
    ids = hf_engine.tokenizer(prompts).input_ids
    for sampling in (Sampling(max_tokens=16, temperature=1.0, seed=7), Sampling(max_tokens=16, temperature=0.0)):
        by_ids = asyncio.run(hf_engine.complete_tokens(ids, sampling, None))
        by_text = asyncio.run(hf_engine.generate(prompts, sampling, None))
        assert [c.text for c in by_ids] == [c.text for c in by_text], sampling
    # Prompt 1 of a request seeded 7 samples from seed 8, as prompt 0 of a request seeded 8.
    seeded = asyncio.run(hf_engine.complete_tokens(ids, Sampling(max_tokens=16, temperature=1.0, seed=7), None))
    alone = asyncio.run(hf_engine.complete_tokens(ids[1:], Sampling(max_tokens=16, temperature=1.0, seed=8), None))
    assert alone[0].text == seeded[1].text
