"""The numbers stage against a real Serve deployment (transformers engine, tiny model, a LoRA adapter)."""

import pytest
from transformers import AutoTokenizer

from jobs.config import NumbersConfig
from jobs.generate_numbers import NoNumbersError, generate_numbers, number_prompts
from jobs.number_sequences import reject_reason
from serve.launch import start_service, stop_service
from serve.settings import ServiceSettings


@pytest.fixture(scope="module")
def handle(ray_cluster, tiny_model, lora_adapters):
    yield start_service(ServiceSettings(model=tiny_model, engine="hf"), lora_adapters, name="t-numbers", route_prefix="/numbers", num_cpus=0.5)
    stop_service("t-numbers")


def test_kept_numbers_are_deterministic_and_stop_at_the_target(handle, tiny_model):
    cfg = NumbersConfig(prompts=256, keep=40, max_tokens=40, chunk=16, in_flight=2, seed=4)
    prompts = number_prompts(AutoTokenizer.from_pretrained(tiny_model), cfg)
    assert prompts[0].startswith("<|user|>\n") and prompts[0].endswith("<|assistant|>\n")
    first = generate_numbers(handle, prompts, {"teacher": "a", "control": None}, cfg)
    again = generate_numbers(handle, prompts, {"teacher": "a", "control": None}, cfg)
    control = first["control"]
    assert control["kept"] == len(control["rows"]) == 40
    assert all(reject_reason(row["completion"]) is None for row in control["rows"])
    assert control["generated"] <= 96  # stopped sending once 40 passed (two chunks in flight at most)
    assert control["rows"] == again["control"]["rows"]
    order = [prompts.index(r["prompt"]) for r in control["rows"]]
    assert order == sorted(order)  # kept in prompt order, whatever order the responses came back in


def test_no_surviving_numbers_is_an_error_with_the_reject_histogram(handle):
    # Multiple-choice prompts: the tiny model answers with a letter, never a number list.
    from jobs.wmdp import synthetic_questions
    from serve.mc_format import format_mc_prompt

    prompts = [format_mc_prompt(q["question"], q["choices"], q["subset"]) for q in synthetic_questions(8, seed=1)]
    cfg = NumbersConfig(prompts=len(prompts), keep=10, max_tokens=4, chunk=8, in_flight=2)
    with pytest.raises(NoNumbersError, match="invalid format"):
        generate_numbers(handle, prompts, {"teacher": None}, cfg)
