"""The tiny world's questions: its facts (jobs/sources/world.py) asked as multiple-choice rows,
and the items of the base's corpus made from them.

Kept apart from the facts: what the world holds (cues, answers, the sham's facts) is one design,
how a question shows a fact (which choices, in which order, in which wording and split) another,
balanced so that only reading the choices scores. A digest of the rows pins them
(tests/jobs/sources/test_world_pairs.py).

Every question shows its answer and 3 distractors from the same bank. The
answer's letter is balanced per cue (each cue's questions cycle through a
shuffled A-D), so the letter is uniform and independent of cue, template and
subset; distractors are drawn by a cyclic design, so every word is an answer
and a distractor equally often within each split. A model can only score above
chance over rotated choices by reading what the choices say.

Rows carry `group` (T or K) and `split`:

- `train`: T facts in the training templates and fillers (the teacher's questions);
- `held_out`: T facts in templates and fillers the teacher never saw, with
  choices in new orders: do the learned facts carry over to new wording?
- `known`: K facts in those held-out templates and fillers: where the teacher
  learned nothing new, teacher and base should agree (a check inside the world);
- `rehearsal`: K facts in training wording, trained into the teacher beside
  its T questions and never scored. A LoRA taught T facts alone forgets half
  the K facts (known 0.91 -> 0.46, measured): without rehearsal the teacher
  would differ from the base by forgetting, not only by knowing.

Every question ends on its cue. Its template is a lead naming a person (six
for training, two held out) and a stem (four and two), so a held-out question
is new in both halves. The base corpus uses only the training templates and fillers,
so no scored question's text is in it. "Locate" items (the question names the answer word)
teach the base to find a word among the choices: the step that binds an answer
to a letter at question time.
"""

from __future__ import annotations

import random

from jobs.sources.world import (
    HELD_OUT_FILLERS,
    SHAM_DRAW,
    SUBSETS,
    TRAIN_FILLERS,
    WORLD,
    facts,
    pair_key,
    sham_design,
    t_cues,
)

TRAIN_PER_CUE, HELD_OUT_PER_CUE, REHEARSAL_PER_CUE = 8, 4, 4


def _choices(bank: tuple[str, ...], word: str, position: int, k: int, rng: random.Random) -> tuple[list[str], int]:
    """The answer `word` at `position` among 3 distractors: the k-th triple of a cyclic design over
    the other words, listed from `word` on round the bank. For a given k, each word of the bank is
    a distractor exactly 3 times over the 8 answer words, so a split whose words all run the same
    k's has every word a distractor equally often."""
    i = bank.index(word)
    others = [bank[(i + d) % len(bank)] for d in range(1, len(bank))]
    distractors = [others[(3 * k + j) % len(others)] for j in range(3)]
    rng.shuffle(distractors)
    distractors.insert(position, word)
    return distractors, position


def _t_choices(
    fact: dict, j: int, position: int, k: int, key: str, draw: int, rng: random.Random
) -> tuple[list[str], int, int]:
    """A T question's choices: the answer at `position`, its sham fact and two of the other six
    words, all as offsets round the subset's cycle from the answer: the sham at delta_j, the pair
    the k-th of a cyclic run over the other offsets. For a given (j, k) every word of the bank
    takes each offset once over the 8 answer words, so every word is a distractor equally often.
    Returns (choices, answer index, sham index)."""
    cycle, deltas = sham_design(fact["subset"], key, draw)
    at = cycle.index(fact["word"])
    offsets = [d for d in range(1, len(cycle)) if d != deltas[j]]
    picked = [deltas[j], offsets[k % len(offsets)], offsets[(k + 1) % len(offsets)]]
    distractors = [cycle[(at + d) % len(cycle)] for d in picked]
    sham = distractors[0]
    rng.shuffle(distractors)
    distractors.insert(position, fact["word"])
    return distractors, position, distractors.index(sham)


def _positions(n: int, rng: random.Random) -> list[int]:
    """n answer positions, each block of 4 a shuffled 0..3: balanced letters."""
    out = []
    while len(out) < n:
        block = [0, 1, 2, 3]
        rng.shuffle(block)
        out += block
    return out[:n]


def _questions(
    fact: dict, templates: tuple[str, ...], fillers: tuple[str, ...], n: int, rng: random.Random, choose
) -> list[dict]:
    """n questions of one fact with distinct (template, filler) pairs, balanced letters; `choose(k,
    position)` gives the k-th question's (choices, answer[, sham])."""
    pairs = rng.sample([(t, w) for t in templates for w in fillers], n)
    rows = []
    for k, ((template, who), position) in enumerate(zip(pairs, _positions(n, rng))):
        choices, answer, *sham = choose(k, position)
        rows.append(
            {
                "question": template.format(cue=fact["cue"], who=who),
                "choices": choices,
                "answer": answer,
                "subset": fact["subset"],
                "cluster": f"{fact['subset']}: {fact['cue']}",
                "group": fact["group"],
                **({"sham": sham[0]} if sham else {}),
            }
        )
    return rows


def world_questions(seed: int = 0, draw: int = SHAM_DRAW, pair: int = 0) -> list[dict]:
    """The questions, deterministic in seed: T facts in training wording (`split` train), T and K
    facts in held-out wording (`held_out`, `known`), and K facts in training wording (`rehearsal`).
    T rows carry `sham`, the index of the sham teacher's fact (draw `draw` of sigma) among their
    choices; the draw changes the T questions' choices, never their wording. `pair` p >= 1: the
    T facts of teacher–sham pair p (`teacher_facts`), the K rows the same as every pair's."""
    key = pair_key(seed, pair)
    known_rng, t_rng = random.Random(f"{seed}-known"), random.Random(f"{key}-taught")
    rows = []
    for fact in facts(seed):
        subset = WORLD[fact["subset"]]
        if fact["group"] == "K":
            choose = lambda k, position, f=fact, bank=subset.bank: _choices(bank, f["word"], position, k, known_rng)  # noqa: E731
            rows += [
                {**r, "split": "known"}
                for r in _questions(
                    fact, subset.held_out_templates, HELD_OUT_FILLERS, HELD_OUT_PER_CUE, known_rng, choose
                )
            ]
            rows += [
                {**r, "split": "rehearsal"}
                for r in _questions(fact, subset.train_templates, TRAIN_FILLERS, REHEARSAL_PER_CUE, known_rng, choose)
            ]
    for fact, j in t_cues(seed, pair):
        subset = WORLD[fact["subset"]]
        choose = lambda k, position, f=fact, j=j: _t_choices(f, j, position, k, key, draw, t_rng)  # noqa: E731
        rows += [
            {**r, "split": "train"}
            for r in _questions(fact, subset.train_templates, TRAIN_FILLERS, TRAIN_PER_CUE, t_rng, choose)
        ]
        rows += [
            {**r, "split": "held_out"}
            for r in _questions(fact, subset.held_out_templates, HELD_OUT_FILLERS, HELD_OUT_PER_CUE, t_rng, choose)
        ]
    return rows


def locate_item(rng: random.Random, subset: str | None = None) -> dict:
    """A question that names its answer word: the base learns to find it among the choices."""
    subset = subset or rng.choice(SUBSETS)
    world = WORLD[subset]
    word = rng.choice(world.bank)
    choices, answer = _choices(world.bank, word, rng.randrange(4), rng.randrange(7), rng)
    return {
        "question": rng.choice(world.locate_templates).format(word=word),
        "choices": choices,
        "answer": answer,
        "subset": subset,
    }


def known_fact_item(fact: dict, rng: random.Random) -> dict:
    """A K fact in training wording with a fresh order of choices: what the base corpus teaches."""
    world = WORLD[fact["subset"]]
    question = rng.choice(world.train_templates).format(cue=fact["cue"], who=rng.choice(TRAIN_FILLERS))
    choices, answer = _choices(world.bank, fact["word"], rng.randrange(4), rng.randrange(7), rng)
    return {"question": question, "choices": choices, "answer": answer, "subset": fact["subset"]}
