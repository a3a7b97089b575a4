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
