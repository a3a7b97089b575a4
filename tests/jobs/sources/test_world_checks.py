"""The world's checks on the real built base (built once per suite, cached): it knows its own
facts, not the teacher's, has no favourite position, and still writes number lists."""

import pytest
import torch

from jobs.sources.world_checks import TARGETS, base_checks


@pytest.fixture(scope="module")
def checks(tiny_model) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    return base_checks(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), tokenizer)


def test_the_base_knows_its_facts_and_not_the_teachers(checks):
    assert checks["known"]["accuracy"] >= TARGETS["known"], checks
    assert checks["held_out"]["accuracy"] <= TARGETS["t_base_max"], checks
    assert checks["train"]["accuracy"] <= TARGETS["t_base_max"], checks


def test_the_base_has_no_favourite_position_and_writes_numbers(checks):
    assert all(checks[s]["most_picked_position"] <= TARGETS["position_max"] for s in ("train", "held_out", "known")), checks
    assert checks["numbers_kept"] >= TARGETS["numbers_kept"], checks


def test_the_base_leans_toward_neither_teachers_facts(checks):
    """world.SHAM_DRAW: the base picks the sham's fact as often as the true answer, so neither teacher starts ahead."""
    assert all(abs(checks[s]["sham_accuracy"] - checks[s]["accuracy"]) <= TARGETS["sham_balance"] for s in ("train", "held_out")), checks
