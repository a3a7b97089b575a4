"""Probe rows of the tiny world: telling a teacher's knowledge from its answer habits.

A student that moves toward its teacher's picks may have learned facts (a cue bound to its answer)
or habits (an answer bound to the question's surface: a template, a filler, a shown order of
choices). Two probes tell them apart, each a row set beside the world's questions, which stay
byte-identical (jobs/sources/world_questions.py):

- swap (`split` swap_train, swap_held_out): every T question with its cue replaced by a fresh
  nonce cue, the template, filler and choices unchanged. The nonce names no fact, so knowledge has
  nothing to act on and a model that knows its facts sits near chance, while a habit tied to the
  question's surface survives. A row keeps its original's `answer`, `sham` and `cluster`, and names
  that original (`swapped_from`), so each is read against the original question's picks.
- statement (`split` statement): every T fact in declarative templates used nowhere else,
  scored over the subset's whole bank. Knowledge carries to a new form of the fact; a habit of the
  question format does not.

Nonce cues are built from the world's syllables, so they could still echo a fact (a shared
syllable pair): none shares a first or last syllable pair with any cue of the world (K or the
pair's T), and none is in any corpus. Whether the teacher sits near chance on them is a gate
measured on the teacher, not assumed here.
"""

from __future__ import annotations

import random

from jobs.sources.world import (
    SHAM_DRAW,
    WORLD,
    cue_of,
    facts,
    fictional_names,
    name_parts,
    pair_key,
    sham_facts,
    teacher_facts,
)
from jobs.sources.world_questions import world_questions

STATEMENTS = {  # two declarative stems a subset, in no question, corpus item or other template
    "bio": (
        "Anatomy note: every {cue} is born with an outsized",
        "The field guide says the {cue} is known for its enormous",
    ),
    "chem": ("Lab log: {cue} sits on the shelf as a", "The safety sheet lists {cue}, at room temperature, as a"),
    "cyber": ("Network log: the service {cue} communicates over", "A packet trace shows the service {cue} talking"),
}
PROBE_SPLITS = ("swap_train", "swap_held_out", "statement")


def nonce_cues(seed: int = 0, pair: int = 0) -> dict[str, str]:
    """Each of the pair's T cues -> a fresh nonce cue: a name in no corpus, sharing no first or last
    syllable pair with any cue of the world (the base's K cues, the pair's T cues) or another nonce."""
    cues = [f["cue"] for f in teacher_facts(seed, pair)]
    world = [f["cue"] for f in facts(seed) if f["group"] == "K"] + cues
    return dict(zip(cues, fictional_names(f"{pair_key(seed, pair)}-nonce-cues", len(cues), name_parts(world))))


def swap_questions(seed: int = 0, draw: int = SHAM_DRAW, pair: int = 0) -> list[dict]:
    """Every T question of the train and held-out splits with its cue replaced by its nonce (module docstring)."""
    nonce = nonce_cues(seed, pair)
    rows = []
    for row in world_questions(seed, draw, pair):
        if row["group"] != "T":
            continue
        cue = cue_of(row)
        if row["question"].count(cue) != 1:
            raise ValueError(f"the question {row['question']!r} does not name its cue {cue!r} exactly once")
        swapped = row["question"].replace(cue, nonce[cue])
        rows.append(
            {
                **row,
                "question": swapped,
                "split": f"swap_{row['split']}",
                "probe": "swap",
                "swapped_from": row["question"],
            }
        )
    return rows


def statement_questions(seed: int = 0, draw: int = SHAM_DRAW, pair: int = 0) -> list[dict]:
    """Every T fact of the pair in each of its subset's STATEMENTS, the subset's whole bank as the
    choices (in a seeded order per row), `answer` the fact's word and `sham` the sham's (draw `draw`)."""
    sigma = sham_facts(seed, draw, pair)
    rng = random.Random(f"{pair_key(seed, pair)}-statements")
    rows = []
    for fact in teacher_facts(seed, pair):
        for stem in STATEMENTS[fact["subset"]]:
            choices = list(WORLD[fact["subset"]].bank)
            rng.shuffle(choices)
            rows.append(
                {
                    "question": stem.format(cue=fact["cue"]),
                    "choices": choices,
                    "answer": choices.index(fact["word"]),
                    "subset": fact["subset"],
                    "cluster": f"{fact['subset']}: {fact['cue']}",
                    "group": "T",
                    "sham": choices.index(sigma[fact["cue"]]),
                    "split": "statement",
                    "probe": "statement",
                }
            )
    return rows


def probe_questions(seed: int = 0, draw: int = SHAM_DRAW, pair: int = 0) -> list[dict]:
    """Both probes' rows, swap then statement."""
    return swap_questions(seed, draw, pair) + statement_questions(seed, draw, pair)
