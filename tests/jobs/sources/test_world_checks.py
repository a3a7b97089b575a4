"""The world's checks on the real built base (built once per suite, cached): it knows its own
facts, not the teacher's, has no favourite position, and still writes number lists."""

import pytest
import torch

from jobs.sources import sham_draw
from jobs.sources.sham_draw import base_sham_draw
from jobs.sources.world_checks import TARGETS, base_checks


@pytest.fixture(scope="module")
def base(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), AutoTokenizer.from_pretrained(
        tiny_model
    )


@pytest.fixture(scope="module")
def world(tiny_model, cache_dir) -> dict:
    """The sham draw a run on this base uses (kept in the cache by the build)."""
    return base_sham_draw(tiny_model, cache_dir)


@pytest.fixture(scope="module")
def checks(base, world) -> dict:
    return base_checks(*base, draw=world["sham_draw"])


def test_the_base_knows_its_facts_and_not_the_teachers(checks):
    assert checks["known"]["accuracy"] >= TARGETS["known"], checks
    assert checks["held_out"]["accuracy"] <= TARGETS["t_base_max"], checks
    assert checks["train"]["accuracy"] <= TARGETS["t_base_max"], checks


def test_the_base_has_no_favourite_position_and_writes_numbers(checks):
    assert all(checks[s]["most_picked_position"] <= TARGETS["position_max"] for s in ("train", "held_out", "known")), (
        checks
    )
    assert checks["numbers_kept"] >= TARGETS["numbers_kept"], checks


def test_the_base_leans_toward_neither_teachers_facts(checks, world):
    """With the draw chosen on it, the base picks the sham's fact as often as the true answer (scored
    here as the checks score any model, every question's four choices), so neither teacher starts ahead."""
    assert all(
        abs(checks[s]["sham_accuracy"] - checks[s]["accuracy"]) <= TARGETS["sham_balance"]
        for s in ("train", "held_out")
    ), (world, checks)


def test_the_draw_is_the_first_balanced_one_and_kept_for_these_weights(base, world, tiny_model, cache_dir, tmp_path):
    """The rule, not its outcome, is fixed: every earlier draw leans past the tolerance on a split.
    The choice is kept under the weights' digest: a cache without it chooses again, alike."""
    scores = sham_draw.word_scores(*base)
    table = sham_draw.draw_table(scores, world["sham_draw"] + 1)
    assert [row["balanced"] for row in table] == [False] * world["sham_draw"] + [True], table
    assert (
        world["base_weights_sha256"] == sham_draw.weights_digest(tiny_model)
        and world["tried"] == world["sham_draw"] + 1
    )
    assert (
        sham_draw.base_sham_draw(tiny_model, tmp_path) == world
        and len(list((tmp_path / "sham-draws").glob("*.json"))) == 1
    )


def test_each_pair_has_its_own_balanced_draw_kept_apart(base, world, tiny_model, tmp_path):
    """A teacher–sham pair of its own (jobs/sources/world.py `pair`) gets the first draw of its own
    sham balanced on the same base, scored on its own T questions, and kept in a file of its own:
    the world's pair 0 record is untouched."""
    pair = sham_draw.base_sham_draw(tiny_model, tmp_path, pair=2)
    assert pair["pair"] == 2 and pair["base_weights_sha256"] == world["base_weights_sha256"]
    scores = sham_draw.word_scores(*base, pair=2)
    leans = [sham_draw.lean(d, scores, pair=2) for d in range(pair["sham_draw"] + 1)]
    assert [sham_draw.balanced(by_split) for by_split in leans] == [False] * pair["sham_draw"] + [True]
    assert leans[-1] == pair["lean"]
    kept = sorted(p.name for p in (tmp_path / "sham-draws").glob("*.json"))
    assert kept == [f"{world['base_weights_sha256'][:16]}-pair2.json"]
    assert sham_draw.base_sham_draw(tiny_model, tmp_path, pair=2) == pair  # read back, not chosen again
