"""The tiny world's questions: answers found by what the choices say, never by where they sit."""

import re
from collections import Counter

import pytest
from scipy.stats import chi2_contingency, chisquare

from jobs.sources.world import (
    HELD_OUT_FILLERS,
    SHAM_DRAW,
    SUBSETS,
    TRAIN_FILLERS,
    WORLD,
    cue_of,
    facts,
    null_sham_facts,
    sham_facts,
)
from jobs.sources.world_questions import known_fact_item, locate_item, world_questions

ROWS = world_questions()
FILLERS = re.compile(r"\b(" + "|".join(TRAIN_FILLERS + HELD_OUT_FILLERS) + r")\b")


def wording(row: dict) -> str:
    """The template a question was made from: its cue and filler put back as fields."""
    return FILLERS.sub("{who}", row["question"].replace(row["cluster"].split(": ")[1], "{cue}"))


def filler(row: dict) -> str:
    return FILLERS.search(row["question"]).group(1)


def test_deterministic_and_unique():
    assert world_questions() == ROWS and world_questions(1) != ROWS
    assert len({r["question"] for r in ROWS}) == len(ROWS)
    assert Counter(r["split"] for r in ROWS) == {"train": 384, "held_out": 192, "known": 192, "rehearsal": 192}


def test_answer_letter_is_uniform_and_independent_of_cue_template_and_subset():
    """Chi-square tests on the generated set: letters uniform overall, and not associated with the
    subset, the template, or the cue (each cue's questions cycle through the letters)."""
    letters = Counter(r["answer"] for r in ROWS)
    assert chisquare([letters[i] for i in range(4)]).pvalue > 0.05
    templates = {t for s in WORLD.values() for t in s.train_templates + s.held_out_templates}
    assert {wording(r) for r in ROWS} == templates
    for key in (lambda r: r["subset"], wording, lambda r: r["cluster"]):
        table = Counter((key(r), r["answer"]) for r in ROWS)
        levels = sorted({k for k, _ in table})
        counts = [[table[level, a] for a in range(4)] for level in levels]
        assert chi2_contingency(counts).pvalue > 0.05


@pytest.mark.parametrize("split", ["train", "held_out", "known", "rehearsal"])
def test_every_word_is_an_answer_and_a_distractor_equally_often(split):
    for subset in SUBSETS:
        rows = [r for r in ROWS if r["split"] == split and r["subset"] == subset]
        answers = Counter(r["choices"][r["answer"]] for r in rows)
        distractors = Counter(c for r in rows for i, c in enumerate(r["choices"]) if i != r["answer"])
        assert set(answers) == set(distractors) == set(WORLD[subset].bank)
        assert len(set(answers.values())) == 1 and len(set(distractors.values())) == 1, (answers, distractors)
        assert all(len(set(r["choices"])) == 4 and r["choices"][r["answer"]] in WORLD[subset].bank for r in rows)


def test_the_sham_has_facts_of_its_own_shown_in_every_teacher_question():
    """sigma (the matched sham's facts): no T cue keeps its answer, each cue has one fixed sham
    word, every word is a sham answer as often as a true one (per subset, over cues and over
    rows), and every T question shows both its answer and its sham fact, at a uniform letter."""
    sigma = sham_facts()
    truth = {f["cue"]: f["word"] for f in facts() if f["group"] == "T"}
    assert set(sigma) == set(truth) and all(sigma[c] != truth[c] for c in truth)
    assert sham_facts() == sigma and sham_facts(1) != sigma and sham_facts(draw=SHAM_DRAW + 1) != sigma
    t_rows = [r for r in ROWS if r["group"] == "T"]
    assert all("sham" not in r for r in ROWS if r["group"] == "K")
    for r in t_rows:
        cue = r["cluster"].split(": ")[1]
        assert (
            r["sham"] != r["answer"]
            and r["choices"][r["sham"]] == sigma[cue]
            and r["choices"][r["answer"]] == truth[cue]
        )
    for subset in SUBSETS:
        cues = [f["cue"] for f in facts() if f["group"] == "T" and f["subset"] == subset]
        assert Counter(sigma[c] for c in cues) == Counter(truth[c] for c in cues)
        for split in ("train", "held_out"):
            rows = [r for r in t_rows if r["subset"] == subset and r["split"] == split]
            assert Counter(r["choices"][r["sham"]] for r in rows) == Counter(r["choices"][r["answer"]] for r in rows)
    letters = Counter(r["sham"] for r in t_rows)
    assert chisquare([letters[i] for i in range(4)]).pvalue > 0.05


def test_the_two_null_shams_hold_facts_no_other_teacher_holds_shown_equally_often():
    """world.null_sham_facts: per T cue, the truth, sigma and the two null shams' words all differ;
    every word is each null sham's fact as often as a true one; and on every split and subset the
    two null shams' words are among a question's choices equally often (exchangeable by design)."""
    truth = {f["cue"]: f["word"] for f in facts() if f["group"] == "T"}
    sigma, one, two = sham_facts(), null_sham_facts(which=1), null_sham_facts(which=2)
    assert all(len({truth[c], sigma[c], one[c], two[c]}) == 4 for c in truth)
    assert Counter(one.values()) == Counter(two.values()) == Counter(truth.values())
    for subset in SUBSETS:
        for split in ("train", "held_out"):
            rows = [r for r in ROWS if r["group"] == "T" and r["subset"] == subset and r["split"] == split]
            shown = [sum(words[cue_of(r)] in r["choices"] for r in rows) for words in (one, two)]
            assert shown[0] == shown[1] > 0, (subset, split, shown)
    with pytest.raises(ValueError, match="1 or 2"):
        null_sham_facts(which=3)


def test_known_and_teacher_facts_never_share_a_cue():
    cues = {g: {f["cue"] for f in facts() if f["group"] == g} for g in ("K", "T")}
    assert len(cues["K"]) == len(cues["T"]) == len(SUBSETS) * 8 * 2
    assert not cues["K"] & cues["T"]
    # no cue inside another
    assert not any(a != b and (a in b) for a in cues["K"] | cues["T"] for b in cues["K"] | cues["T"])
    by_group = {g: {r["cluster"].split(": ")[1] for r in ROWS if r["group"] == g} for g in ("K", "T")}
    assert by_group == cues
    assert {r["split"] for r in ROWS if r["group"] == "T"} == {"train", "held_out"} and {
        r["split"] for r in ROWS if r["group"] == "K"
    } == {
        "known",
        "rehearsal",
    }


def test_held_out_wording_is_new():
    """Held-out and known questions use templates and fillers the training questions never use."""
    for split in ("held_out", "known"):  # rehearsal: K facts in training wording, trained, never scored
        assert not {wording(r) for r in ROWS if r["split"] == "train"} & {
            wording(r) for r in ROWS if r["split"] == split
        }
        assert not {filler(r) for r in ROWS if r["split"] == "train"} & {filler(r) for r in ROWS if r["split"] == split}


def test_base_items_are_answerable_by_content():
    import random

    rng = random.Random(0)
    for _ in range(50):
        item = locate_item(rng)
        assert item["choices"][item["answer"]] in item["question"]
        assert sum(c in item["question"] for c in item["choices"]) == 1
    fact = next(f for f in facts() if f["group"] == "K")
    item = known_fact_item(fact, rng)
    assert fact["cue"] in item["question"] and item["choices"][item["answer"]] == fact["word"]
