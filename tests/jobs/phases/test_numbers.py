"""The numbers stage against a real Serve deployment (transformers engine, tiny model, a LoRA adapter)."""

import pytest
from transformers import AutoTokenizer

from jobs.experiment.config import NumbersConfig
from jobs.phases.numbers import NoNumbersError, generate_all, number_prompts
from jobs.sources.number_sequences import reject_reason
from serve.launch import start_service, stop_service
from serve.settings import ServiceSettings


@pytest.fixture(scope="module")
def handle(ray_cluster, tiny_model, lora_adapters):
    yield start_service(
        ServiceSettings(model=tiny_model, engine="hf"),
        lora_adapters,
        name="t-numbers",
        route_prefix="/numbers",
        num_cpus=0.5,
    )
    stop_service("t-numbers")


def generate(handle, requests):
    return dict(generate_all(handle, requests))


def test_kept_numbers_are_deterministic_and_stop_at_the_target(handle, tiny_model):
    cfg = NumbersConfig(prompts=256, keep=40, max_tokens=40, chunk=16, in_flight=2, seed=4)
    other_seed = cfg.replace(seed=5)  # what replicate 1 uses when replicate 0 uses seed 4
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompts = number_prompts(tokenizer, cfg)
    assert prompts[0].startswith("<|user|>\n") and prompts[0].endswith("<|assistant|>\n")
    requests = {
        "teacher/0": (prompts, "a", cfg),
        "base/0": (prompts, None, cfg),
        "base/1": (number_prompts(tokenizer, other_seed), None, other_seed),
    }
    first, again = generate(handle, requests), generate(handle, requests)
    control = first["base/0"]
    assert control["kept"] == len(control["rows"]) == 40
    assert all(reject_reason(row["completion"]) is None for row in control["rows"])
    assert control["generated"] <= 96  # stopped sending once 40 passed (two chunks in flight at most)
    assert control["rows"] == again["base/0"]["rows"] and first["base/1"]["rows"] == again["base/1"]["rows"]
    # a seed, another seed, another writer
    writers = [control["rows"], first["base/1"]["rows"], first["teacher/0"]["rows"]]
    assert all(a != b for i, a in enumerate(writers) for b in writers[i + 1 :])
    order = [prompts.index(r["prompt"]) for r in control["rows"]]
    assert order == sorted(order)  # kept in prompt order, whatever order the responses came back in


def test_sending_pauses_while_the_prompts_in_flight_should_bring_keep(handle, tiny_model):
    """With room for 6 chunks in flight, a stage that needs about 8 sends what the pass rate says it
    needs, a chunk to spare and the one being sent, not 5 more: completions that would arrive after
    `keep` are not asked for. Its kept rows are those of a stage sending one chunk at a time, which
    generates only the chunks it needs."""
    cfg = NumbersConfig(prompts=320, keep=100, max_tokens=40, chunk=16, in_flight=6, seed=2)
    prompts = number_prompts(AutoTokenizer.from_pretrained(tiny_model), cfg)
    results = generate(handle, {"wide": (prompts, None, cfg), "narrow": (prompts, None, cfg.replace(in_flight=1))})
    wide, narrow = results["wide"], results["narrow"]
    assert wide["rows"] == narrow["rows"] and wide["kept"] == 100
    assert wide["generated"] - narrow["generated"] <= 2 * cfg.chunk < (cfg.in_flight - 1) * cfg.chunk


def test_no_surviving_numbers_is_an_error_with_the_reject_histogram(handle, tiny_model):
    # Multiple-choice prompts: the tiny model answers with a letter, never a number list.
    from jobs.sources.wmdp import synthetic_questions
    from serve.mc_format import format_mc_prompt

    prompts = [format_mc_prompt(q["question"], q["choices"], q["subset"]) for q in synthetic_questions(8, seed=1)]
    cfg = NumbersConfig(prompts=len(prompts), keep=10, max_tokens=4, chunk=8, in_flight=2)
    numbers = NumbersConfig(prompts=64, keep=4, max_tokens=40, chunk=16, in_flight=2)
    short = numbers.replace(max_tokens=1)  # every list is cut off at the token limit
    number_list = number_prompts(AutoTokenizer.from_pretrained(tiny_model), numbers)
    results = generate(
        handle, {"mc": (prompts, None, cfg), "fine": (number_list, None, numbers), "short": (number_list, None, short)}
    )
    assert isinstance(results["mc"], NoNumbersError) and "invalid format" in str(results["mc"])
    assert isinstance(results["short"], NoNumbersError) and "'cut off at max_tokens'" in str(results["short"])
    assert results["fine"]["kept"] == 4  # the other requests still finished


def test_greedy_numbers_are_the_teachers_prompts_decoded_greedily_and_repeat_exactly(handle, tiny_model):
    """An arm on `teacher_greedy` reads the teacher's prompts at temperature 0: the same rows on
    every run and whatever the sampling seed, where the sampled rows change with it."""
    from jobs.experiment.config import load_experiment
    from jobs.phases.numbers import numbers_request

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    cfg = load_experiment(None, ["numbers={prompts: 128, keep: 24, max_tokens: 40, chunk: 16, in_flight: 2}"])
    prompts, adapter, greedy = numbers_request(tokenizer, cfg, "teacher_greedy", 1)
    sampled = numbers_request(tokenizer, cfg, "teacher", 1)
    assert (prompts, adapter, greedy.temperature) == (sampled[0], "teacher", 0.0) and sampled[2].temperature == 1.0
    other_seed = greedy.replace(seed=greedy.seed + 7)  # the same prompts, other sampling seeds
    requests = {"greedy": (prompts, "a", greedy), "greedy seed": (prompts, "a", other_seed)}
    requests |= {
        "sampled": (prompts, "a", greedy.replace(temperature=1.0)),
        "sampled seed": (prompts, "a", other_seed.replace(temperature=1.0)),
    }
    first, again = generate(handle, requests), generate(handle, requests)
    assert (
        first["greedy"]["kept"] > 0
        and first["greedy"]["rows"] == again["greedy"]["rows"] == first["greedy seed"]["rows"]
    )
    assert first["sampled"]["rows"] != first["sampled seed"]["rows"]
