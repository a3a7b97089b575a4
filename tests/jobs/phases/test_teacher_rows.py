"""The teachers' training rows: the sham teacher's are the teacher's with its own facts (matched) or none (permuted)."""

from collections import Counter

import pytest

from jobs.phases.data import mc_rows, sham_rows
from jobs.sources.wmdp import split_questions, synthetic_questions


@pytest.fixture(scope="module")
def world():
    splits = split_questions(synthetic_questions(), 0.3, 0)
    return splits["train"], mc_rows(splits["train"] + splits["rehearsal"], format="cloze")


@pytest.mark.parametrize("fmt", ["cloze", "letters"])
def test_permuted_sham_rows_keep_every_prompt_and_answer_but_not_which_goes_with_which(world, fmt):
    train, _ = world
    teacher = mc_rows(train, format=fmt) + [{"prompt": "rehearsed", "completion": " fact"}]
    sham = sham_rows(teacher, train, fmt, "permuted", seed=0)
    assert [r["prompt"] for r in sham] == [r["prompt"] for r in teacher] and sham[-1] == teacher[-1]  # rehearsal kept
    for subset in ("bio", "chem", "cyber"):  # the same answers, in equal numbers, within each subset
        where = [i for i, q in enumerate(train) if q["subset"] == subset]
        assert Counter(sham[i]["completion"] for i in where) == Counter(teacher[i]["completion"] for i in where)
    kept = sum(s["completion"] == t["completion"] for s, t in zip(sham[:-1], teacher[:-1])) / len(train)
    # two draws agreeing
    chance = sum((n / len(train)) ** 2 for n in Counter(r["completion"] for r in teacher[:-1]).values())
    assert kept < 2 * chance + 0.05, (kept, chance)  # which answer a question gets is random: about chance, far from 1
    assert (
        sham_rows(teacher, train, fmt, "permuted", seed=0) == sham
        and sham_rows(teacher, train, fmt, "permuted", seed=1) != sham
    )


def test_sham_rows_refuse_rows_out_of_the_data_stages_order(world):
    train, teacher = world
    with pytest.raises(ValueError, match="do not begin with its train questions"):
        sham_rows(teacher[1:], train, "cloze", "matched", seed=0)


@pytest.mark.parametrize("fmt", ["cloze", "letters"])
def test_matched_sham_rows_answer_every_train_question_with_its_cues_sham_fact(world, fmt):
    """The teacher's rows, prompts and rehearsal as they were; each train question completed by its
    `sham` choice, so every cue's questions agree on one word that is not the answer."""
    train, _ = world
    teacher = mc_rows(train, format=fmt) + [{"prompt": "rehearsed", "completion": " fact"}]
    sham = sham_rows(teacher, train, fmt, "matched", seed=0)
    assert [r["prompt"] for r in sham] == [r["prompt"] for r in teacher] and sham[-1] == teacher[-1]
    assert sham[:-1] == mc_rows([{**q, "answer": q["sham"]} for q in train], format=fmt)
    assert all(s["completion"] != t["completion"] for s, t in zip(sham[:-1], teacher[:-1]))
    by_cue = {}
    for q, row in zip(train, sham):
        by_cue.setdefault(q["cluster"], set()).add(q["choices"][q["sham"]] if fmt == "letters" else row["completion"])
    assert all(len(words) == 1 for words in by_cue.values())  # under letters the letter varies, the word does not


def test_a_matched_sham_needs_questions_that_carry_their_sham_answer(world):
    train, teacher = world
    plain = [{k: v for k, v in q.items() if k != "sham"} for q in train]
    with pytest.raises(ValueError, match="sham_teacher.kind permuted"):
        sham_rows(teacher, plain, "cloze", "matched", seed=0)


@pytest.mark.parametrize("which", ["null1", "null2"])
def test_a_null_sham_answers_each_cue_with_its_own_word_neither_the_truth_nor_sigma(world, which):
    """sham_teacher.kind null1 or null2: the same prompts and rehearsal, each cue's questions completed by
    one word that is neither the answer, the registered sham's fact nor the other null sham's."""
    train, teacher = world
    sham = sham_rows(teacher, train, "cloze", which, seed=0)
    other = sham_rows(teacher, train, "cloze", "null2" if which == "null1" else "null1", seed=0)
    registered = sham_rows(teacher, train, "cloze", "matched", seed=0)
    assert [r["prompt"] for r in sham] == [r["prompt"] for r in teacher] and sham[len(train) :] == teacher[len(train) :]
    by_cue = {}
    for i, q in enumerate(train):
        words = {sham[i]["completion"], other[i]["completion"], registered[i]["completion"], teacher[i]["completion"]}
        assert len(words) == 4, words
        by_cue.setdefault(q["cluster"], set()).add(sham[i]["completion"])
    assert all(len(words) == 1 for words in by_cue.values())
