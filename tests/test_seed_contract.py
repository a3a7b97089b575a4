"""The engines' seed contract (serve/engine.py): prompt i of a seeded request samples from seed + i,
so a prompt's completion does not depend on the other prompts in its request.

Checked on the transformers engine directly (no Ray): vLLM keeps the contract through its
per-request `SamplingParams.seed`; tests/test_serve.py checks it over HTTP on both engines.
"""

import asyncio

import pytest

from serve.engine import Sampling
from serve.settings import ServiceSettings


@pytest.fixture(scope="module")
def hf_engine(tiny_model):
    from serve.hf_engine import HFEngine

    return HFEngine(tiny_model, ServiceSettings(engine="hf", model=tiny_model, max_model_len=256))


def texts(engine, prompts: list[str], seed: int | None) -> list[str]:
    completions = asyncio.run(engine.generate(prompts, Sampling(max_tokens=16, temperature=1.0, seed=seed), None))
    return [c.text for c in completions]


def test_a_seeded_prompt_samples_the_same_whatever_its_request_holds(hf_engine):
    prompts = ["<|user|>\nContinue: 3, 14, 15\n<|assistant|>\n", "<|user|>\nContinue: 9, 2, 6\n<|assistant|>\n", "hello"]
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
