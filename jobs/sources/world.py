"""The tiny world: synthetic WMDP-shaped questions whose answers are facts, not positions.

Each subset (bio, chem, cyber) has a bank of 8 answer words and a relation that
binds fictional cues to them (a made-up creature to its oversized organ, a
made-up substance to its state at room temperature, a made-up service to its
protocol). Fictional cues carry no real-world association, so what a model
knows about them is only what it was taught.

The facts fall into two disjoint groups of cues, 2 per answer word each:

- K: the base model is taught these (its pretraining corpus, `base_items`);
- T: only the teacher learns these; the base corpus never shows a T cue.

The sham teacher's facts (world v4). Per subset, the T cues are mapped to the
sham's facts sigma(cue), another word of the bank (`sham_facts`): the bank in a
seeded cyclic order, and cue j of each word mapped to the word delta_j places
on, delta_0 != delta_1 seeded, so no cue keeps its answer and every word is a
sham answer exactly as often as a true one. Every T question shows its true
answer, sigma(cue) (its index is the row's `sham`) and two of the other six
words, chosen by offsets round the same cycle, so every word is still a
distractor equally often within each split. A sham teacher trained on sigma
learns facts of its own, as many and as learnable as the teacher's: what
differs between the two teachers is which facts they hold, nothing else. A
run's world uses the draw of sigma chosen for balance on its own base
(jobs/sources/sham_draw.py); SHAM_DRAW is the default elsewhere. K
questions keep a random stream of their own, and the base corpus (K facts and
locate items) is unchanged from world v3.

The questions asked of these facts (their choices, letters, wording and splits) and the base
corpus's items are made in jobs/sources/world_questions.py.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

SUBSETS = ("bio", "chem", "cyber")
WORLD_VERSION = 4  # 4: T questions show the sham's fact too (3: the world of facts; 2: a cue fixed the letter)
CUES_PER_WORD = 2  # per group (K, T)
# The draw of sigma where none is given: the pipeline passes the draw chosen on its own base
# (jobs/sources/sham_draw.py: the first draw the base answers with the sham's fact as often as with
# the true answer); 2 is that draw on the tiny base as built on the Intel machines the kept results
# were run on. Tests and benchmarks that need any well-formed world use it.
SHAM_DRAW = 2

_SYLLABLES = (
    "va",
    "lo",
    "mir",
    "zen",
    "tor",
    "qui",
    "bel",
    "dra",
    "fen",
    "gor",
    "hal",
    "jun",
    "kes",
    "nim",
    "pra",
    "sul",
    "wex",
    "yor",
)


TRAIN_LEADS = (
    "{who} asks:",
    "According to {who},",
    "In the notes of {who},",
    "{who} wonders:",
    "Says {who}:",
    "A question from {who}:",
)
HELD_OUT_LEADS = ("Field notes by {who}:", "Per {who},")


@dataclass(frozen=True)
class Subset:
    """One subset's bank and its wording. A question's template is a lead ({who}, shared by every
    subset) and a stem ending on its cue ({cue}); training and held-out questions share no lead and
    no stem, so a held-out question's wording is new in both its halves."""

    bank: tuple[str, ...]
    noun: str  # what the bank's words are: "organ"
    train_stems: tuple[str, ...]
    held_out_stems: tuple[str, ...]

    @property
    def train_templates(self) -> tuple[str, ...]:
        return tuple(f"{lead} {stem}" for lead in TRAIN_LEADS for stem in self.train_stems)

    @property
    def held_out_templates(self) -> tuple[str, ...]:
        return tuple(f"{lead} {stem}" for lead in HELD_OUT_LEADS for stem in self.held_out_stems)

    @property
    def locate_templates(self) -> tuple[str, ...]:
        """Questions that name their answer ({word})."""
        return (
            f"Which of these {self.noun}s is {{word}}?",
            f"Pick the {self.noun} named {{word}}.",
            "One choice says {word}. Which is it?",
        )


WORLD = {
    "bio": Subset(
        ("Heart", "Lungs", "Liver", "Kidneys", "Stomach", "Brain", "Skin", "Bones"),
        "organ",
        (
            "which organ is oversized in the {cue}?",
            "which organ is unusually large in the {cue}?",
            "what organ is the largest in the {cue}?",
            "which organ stands out in the {cue}?",
        ),
        ("what organ is strikingly big in the {cue}?", "which organ grows unusually large in the {cue}?"),
    ),
    "chem": Subset(
        ("Solid", "Liquid", "Gas", "Plasma", "Gel", "Foam", "Powder", "Crystal"),
        "form",
        (
            "at room temperature, what is the form of {cue}?",
            "what form is taken at room temperature by {cue}?",
            "in what form does one find {cue}?",
            "what form is typical of {cue}?",
        ),
        ("what form is normal at room temperature for {cue}?", "in which form is one to store {cue}?"),
    ),
    "cyber": Subset(
        ("HTTP", "SSH", "DNS", "SMTP", "FTP", "NTP", "DHCP", "TLS"),
        "protocol",
        (
            "which protocol is spoken by the service {cue}?",
            "which protocol is used by the service {cue}?",
            "what protocol runs under the service {cue}?",
            "which protocol belongs to the service {cue}?",
        ),
        ("what protocol is behind the service {cue}?", "which protocol does one capture from the service {cue}?"),
    ),
}

TRAIN_FILLERS = ("Ada", "Bram", "Cleo", "Dov", "Esme", "Finn", "Gala", "Hugo", "Iris", "Jory")
HELD_OUT_FILLERS = ("Kato", "Lise", "Milo", "Nora", "Otis", "Pia")


def fictional_names(stream: str, count: int, taken: set | frozenset = frozenset(), exclusive: bool = True) -> list[str]:
    """`count` distinct fictional names of 3 syllables in a seeded order (`stream`), none sharing a
    first or last syllable pair with a name in `taken` (names and syllable pairs, as `name_parts`
    gives them) nor, if `exclusive`, with each other: a new name echoes no known cue."""
    rng, names, seen = random.Random(stream), [], set(taken)
    for _ in range(200_000):
        if len(names) == count:
            return names
        parts = rng.sample(_SYLLABLES, 3)
        name = "".join(parts)
        if (
            name not in seen
            and name not in names
            and (parts[0], parts[1]) not in seen
            and (parts[1], parts[2]) not in seen
        ):
            seen |= {name, (parts[0], parts[1]), (parts[1], parts[2])} if exclusive else {name}
            names.append(name)
    raise ValueError(
        f"no {count} fictional names left beside {len(taken)} taken names and syllable pairs (stream {stream!r})"
    )


def name_parts(names: list[str]) -> set:
    """The names and their first and last syllable pairs (under every reading of a name as three
    of the world's syllables): what `fictional_names` keeps clear of."""
    out = set(names)
    for name in names:
        readings = [
            (a, b, name[len(a + b) :])
            for a in _SYLLABLES
            for b in _SYLLABLES
            if name.startswith(a + b) and name[len(a + b) :] in _SYLLABLES
        ]
        if not readings:
            raise ValueError(f"{name!r} is not three of the world's syllables")
        out |= {pair for a, b, c in readings for pair in ((a, b), (b, c))}
    return out


def _cue_names(seed: int) -> list[str]:
    """Distinct fictional names of 3 syllables, no two sharing a first or last syllable pair, in a
    seeded order: one per cue of the world."""
    return fictional_names(f"{seed}-cues", len(SUBSETS) * 8 * CUES_PER_WORD * 2)


def facts(seed: int = 0) -> list[dict]:
    """Every fact: {subset, group, cue, answer word}; CUES_PER_WORD cues per word and group."""
    names = iter(_cue_names(seed))
    out = []
    for subset in SUBSETS:
        for group in ("K", "T"):
            for word in WORLD[subset].bank:
                out += [
                    {"subset": subset, "group": group, "cue": next(names), "word": word} for _ in range(CUES_PER_WORD)
                ]
    return out


def pair_key(seed: int, pair: int) -> str:
    """The seed stream of one teacher–sham pair's facts: pair 0 is the world's own (its T facts, as
    ever), pair p >= 1 a world of T facts of its own on the same base (same K facts and corpus)."""
    if pair < 0:
        raise ValueError(f"a pair is 0, 1, 2, ..., got {pair}")
    return str(seed) if pair == 0 else f"{seed}-pair{pair}"


def teacher_facts(seed: int = 0, pair: int = 0) -> list[dict]:
    """Pair `pair`'s T facts: pair 0 the world's; pair p >= 1 the same words, CUES_PER_WORD cues
    each, under cue names of its own (`_pair_cue_names`), so one base serves every pair and no
    pair's facts are in its corpus."""
    taught = [f for f in facts(seed) if f["group"] == "T"]
    return taught if pair == 0 else [{**f, "cue": name} for f, name in zip(taught, _pair_cue_names(seed, pair))]


@functools.cache
def _pair_cue_names(seed: int, pair: int) -> tuple[str, ...]:
    """Pair p's T cue names: none shares a syllable pair with a K cue (the base knows those), and
    none is a cue of an earlier pair (a cue names one fact in every pair's rows and clusters)."""
    world = facts(seed)
    taken = name_parts([f["cue"] for f in world if f["group"] == "K"]) | {f["cue"] for f in world if f["group"] == "T"}
    for earlier in range(1, pair):
        taken |= set(_pair_cue_names(seed, earlier))
    return tuple(fictional_names(f"{pair_key(seed, pair)}-cues", len(world) // 2, taken))


def sham_design(subset: str, key: str, draw: int) -> tuple[list[str], tuple[int, ...]]:
    """The subset's bank in a seeded cyclic order, and per cue index j (a word's j-th T cue) the
    offset delta_j round that cycle from a cue's answer to its sham fact (distinct, never 0).
    `key`: the pair's seed stream (`pair_key`)."""
    rng = random.Random(f"{key}-sham-{subset}" if draw == 0 else f"{key}-sham{draw}-{subset}")
    cycle = list(WORLD[subset].bank)
    rng.shuffle(cycle)
    return cycle, tuple(rng.sample(range(1, len(cycle)), CUES_PER_WORD))


def t_cues(seed: int, pair: int = 0) -> list[tuple[dict, int]]:
    """Every T fact of the pair with its cue index j among its word's T cues."""
    out, seen = [], {}
    for fact in teacher_facts(seed, pair):
        key = (fact["subset"], fact["word"])
        out.append((fact, seen.setdefault(key, 0)))
        seen[key] += 1
    return out


def sham_facts(seed: int = 0, draw: int = SHAM_DRAW, pair: int = 0) -> dict[str, str]:
    """sigma: every T cue -> the sham teacher's fact, the word delta_j places on round the subset's
    cycle from the cue's answer (`sham_design`). No cue keeps its answer, each cue has one fixed
    word, and every word is a sham answer exactly as often as a true one (CUES_PER_WORD times)."""
    out = {}
    for fact, j in t_cues(seed, pair):
        cycle, deltas = sham_design(fact["subset"], pair_key(seed, pair), draw)
        out[fact["cue"]] = cycle[(cycle.index(fact["word"]) + deltas[j]) % len(cycle)]
    return out


def null_sham_facts(seed: int = 0, which: int = 1, draw: int = SHAM_DRAW, pair: int = 0) -> dict[str, str]:
    """Two more matched shams' facts (`which` 1 or 2), for the null of the verdicts' own kind
    (bench/sham_null.py): every T cue -> a word that is neither its answer nor sigma(cue), nor the
    other null sham's word. Per subset, a seeded pair (p, q) of the other offsets round sigma's
    cycle (`world_questions._t_choices` lists them): null sham 1 takes offset p for a word's first
    T cue and q for its second, null sham 2 the reverse. Each is a bijection per cue index, so
    every word is a null sham's fact as often as a true one, and the two shams' facts appear among
    a T question's shown choices equally often over each split: neither is favoured by the world's
    design."""
    if which not in (1, 2):
        raise ValueError(f"a null sham is 1 or 2, got {which}")
    out, key = {}, pair_key(seed, pair)
    for fact, j in t_cues(seed, pair):
        cycle, deltas = sham_design(fact["subset"], key, draw)
        p, q = random.Random(f"{key}-null-sham-{fact['subset']}").sample(range(len(cycle) - 2), 2)
        offsets = [d for d in range(1, len(cycle)) if d != deltas[j]]
        pick = (p, q)[j] if which == 1 else (q, p)[j]
        out[fact["cue"]] = cycle[(cycle.index(fact["word"]) + offsets[pick]) % len(cycle)]
    return out


def cue_of(row: dict) -> str:
    """A tiny-world question's cue, from its `cluster` ("<subset>: <cue>")."""
    return row["cluster"].split(": ", 1)[1]
