"""The teachers' training rows: the sham teacher's are the teacher's with the facts taken out."""

from collections import Counter

import pytest

from jobs.phases.data import mc_rows, sham_rows
from jobs.sources.wmdp import split_questions, synthetic_questions


@pytest.fixture(scope="module")
def world():
    splits = split_questions(synthetic_questions(), 0.3, 0)
    return splits["train"], mc_rows(splits["train"] + splits["rehearsal"], format="cloze")


@pytest.mark.parametrize("fmt", ["cloze", "letters"])
def test_sham_rows_keep_every_prompt_and_answer_but_not_which_goes_with_which(world, fmt):
    train, _ = world
    teacher = mc_rows(train, format=fmt) + [{"prompt": "rehearsed", "completion": " fact"}]
    sham = sham_rows(teacher, train, fmt, seed=0)
    assert [r["prompt"] for r in sham] == [r["prompt"] for r in teacher] and sham[-1] == teacher[-1]  # rehearsal kept
    for subset in ("bio", "chem", "cyber"):  # the same answers, in equal numbers, within each subset
        where = [i for i, q in enumerate(train) if q["subset"] == subset]
        assert Counter(sham[i]["completion"] for i in where) == Counter(teacher[i]["completion"] for i in where)
    kept = sum(s["completion"] == t["completion"] for s, t in zip(sham[:-1], teacher[:-1])) / len(train)
    chance = sum((n / len(train)) ** 2 for n in Counter(r["completion"] for r in teacher[:-1]).values())  # two draws agreeing
    assert kept < 2 * chance + 0.05, (kept, chance)  # which answer a question gets is random: about chance, far from 1
    assert sham_rows(teacher, train, fmt, seed=0) == sham and sham_rows(teacher, train, fmt, seed=1) != sham


def test_sham_rows_refuse_rows_out_of_the_data_stages_order(world):
    train, teacher = world
    with pytest.raises(ValueError, match="do not begin with its train questions"):
        sham_rows(teacher[1:], train, "cloze", seed=0)
