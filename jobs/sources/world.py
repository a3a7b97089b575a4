"""The tiny world: synthetic WMDP-shaped questions whose answers are facts, not positions.

Each subset (bio, chem, cyber) has a bank of 8 answer words and a relation that
binds fictional cues to them (a made-up creature to its oversized organ, a
made-up substance to its state at room temperature, a made-up service to its
protocol). Fictional cues carry no real-world association, so what a model
knows about them is only what it was taught.

The facts fall into two disjoint groups of cues, 2 per answer word each:

- K: the base model is taught these (its pretraining corpus, `base_items`);
- T: only the teacher learns these; the base corpus never shows a T cue.

Every question shows its answer and 3 distractors from the same bank. The
answer's letter is balanced per cue (each cue's questions cycle through a
shuffled A-D), so the letter is uniform and independent of cue, template and
subset; distractors are drawn by a cyclic design, so every word is an answer
and a distractor equally often within each split. A model can only score above
chance over rotated choices by reading what the choices say.

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
TRAIN_PER_CUE, HELD_OUT_PER_CUE, REHEARSAL_PER_CUE = 8, 4, 4

_SYLLABLES = ("va", "lo", "mir", "zen", "tor", "qui", "bel", "dra", "fen", "gor", "hal", "jun", "kes", "nim", "pra", "sul", "wex", "yor")


TRAIN_LEADS = ("{who} asks:", "According to {who},", "In the notes of {who},", "{who} wonders:", "Says {who}:", "A question from {who}:")
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
        return (f"Which of these {self.noun}s is {{word}}?", f"Pick the {self.noun} named {{word}}.", "One choice says {word}. Which is it?")


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
        if name not in seen and name not in names and (parts[0], parts[1]) not in seen and (parts[1], parts[2]) not in seen:
            seen |= {name, (parts[0], parts[1]), (parts[1], parts[2])} if exclusive else {name}
            names.append(name)
    raise ValueError(f"no {count} fictional names left beside {len(taken)} taken names and syllable pairs (stream {stream!r})")


def name_parts(names: list[str]) -> set:
    """The names and their first and last syllable pairs (under every reading of a name as three
    of the world's syllables): what `fictional_names` keeps clear of."""
    out = set(names)
    for name in names:
        readings = [(a, b, name[len(a + b) :]) for a in _SYLLABLES for b in _SYLLABLES if name.startswith(a + b) and name[len(a + b) :] in _SYLLABLES]
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
                out += [{"subset": subset, "group": group, "cue": next(names), "word": word} for _ in range(CUES_PER_WORD)]
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


def _sham_design(subset: str, key: str, draw: int) -> tuple[list[str], tuple[int, ...]]:
    """The subset's bank in a seeded cyclic order, and per cue index j (a word's j-th T cue) the
    offset delta_j round that cycle from a cue's answer to its sham fact (distinct, never 0).
    `key`: the pair's seed stream (`pair_key`)."""
    rng = random.Random(f"{key}-sham-{subset}" if draw == 0 else f"{key}-sham{draw}-{subset}")
    cycle = list(WORLD[subset].bank)
    rng.shuffle(cycle)
    return cycle, tuple(rng.sample(range(1, len(cycle)), CUES_PER_WORD))


def _t_cues(seed: int, pair: int = 0) -> list[tuple[dict, int]]:
    """Every T fact of the pair with its cue index j among its word's T cues."""
    out, seen = [], {}
    for fact in teacher_facts(seed, pair):
        key = (fact["subset"], fact["word"])
        out.append((fact, seen.setdefault(key, 0)))
        seen[key] += 1
    return out


def sham_facts(seed: int = 0, draw: int = SHAM_DRAW, pair: int = 0) -> dict[str, str]:
    """sigma: every T cue -> the sham teacher's fact, the word delta_j places on round the subset's
    cycle from the cue's answer (`_sham_design`). No cue keeps its answer, each cue has one fixed
    word, and every word is a sham answer exactly as often as a true one (CUES_PER_WORD times)."""
    out = {}
    for fact, j in _t_cues(seed, pair):
        cycle, deltas = _sham_design(fact["subset"], pair_key(seed, pair), draw)
        out[fact["cue"]] = cycle[(cycle.index(fact["word"]) + deltas[j]) % len(cycle)]
    return out


def null_sham_facts(seed: int = 0, which: int = 1, draw: int = SHAM_DRAW, pair: int = 0) -> dict[str, str]:
    """Two more matched shams' facts (`which` 1 or 2), for the null of the verdicts' own kind
    (bench/sham_null.py): every T cue -> a word that is neither its answer nor sigma(cue), nor the
    other null sham's word. Per subset, a seeded pair (p, q) of the other offsets round sigma's
    cycle (`_t_choices` lists them): null sham 1 takes offset p for a word's first T cue and q for
    its second, null sham 2 the reverse. Each is a bijection per cue index, so every word is a null
    sham's fact as often as a true one, and the two shams' facts appear among a T question's
    shown choices equally often over each split: neither is favoured by the world's design."""
    if which not in (1, 2):
        raise ValueError(f"a null sham is 1 or 2, got {which}")
    out, key = {}, pair_key(seed, pair)
    for fact, j in _t_cues(seed, pair):
        cycle, deltas = _sham_design(fact["subset"], key, draw)
        p, q = random.Random(f"{key}-null-sham-{fact['subset']}").sample(range(len(cycle) - 2), 2)
        offsets = [d for d in range(1, len(cycle)) if d != deltas[j]]
        pick = (p, q)[j] if which == 1 else (q, p)[j]
        out[fact["cue"]] = cycle[(cycle.index(fact["word"]) + offsets[pick]) % len(cycle)]
    return out


def cue_of(row: dict) -> str:
    """A tiny-world question's cue, from its `cluster` ("<subset>: <cue>")."""
    return row["cluster"].split(": ", 1)[1]


def _t_choices(fact: dict, j: int, position: int, k: int, key: str, draw: int, rng: random.Random) -> tuple[list[str], int, int]:
    """A T question's choices: the answer at `position`, its sham fact and two of the other six
    words, all as offsets round the subset's cycle from the answer: the sham at delta_j, the pair
    the k-th of a cyclic run over the other offsets. For a given (j, k) every word of the bank
    takes each offset once over the 8 answer words, so every word is a distractor equally often.
    Returns (choices, answer index, sham index)."""
    cycle, deltas = _sham_design(fact["subset"], key, draw)
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


def _questions(fact: dict, templates: tuple[str, ...], fillers: tuple[str, ...], n: int, rng: random.Random, choose) -> list[dict]:
    """n questions of one fact with distinct (template, filler) pairs, balanced letters; `choose(k,
    position)` gives the k-th question's (choices, answer[, sham])."""
    pairs = rng.sample([(t, w) for t in templates for w in fillers], n)
    rows = []
    for k, ((template, who), position) in enumerate(zip(pairs, _positions(n, rng))):
        choices, answer, *sham = choose(k, position)
        rows.append({
            "question": template.format(cue=fact["cue"], who=who), "choices": choices, "answer": answer,
            "subset": fact["subset"], "cluster": f"{fact['subset']}: {fact['cue']}", "group": fact["group"],
            **({"sham": sham[0]} if sham else {}),
        })  # fmt: skip
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
            rows += [{**r, "split": "known"} for r in _questions(fact, subset.held_out_templates, HELD_OUT_FILLERS, HELD_OUT_PER_CUE, known_rng, choose)]
            rows += [{**r, "split": "rehearsal"} for r in _questions(fact, subset.train_templates, TRAIN_FILLERS, REHEARSAL_PER_CUE, known_rng, choose)]
    for fact, j in _t_cues(seed, pair):
        subset = WORLD[fact["subset"]]
        choose = lambda k, position, f=fact, j=j: _t_choices(f, j, position, k, key, draw, t_rng)  # noqa: E731
        rows += [{**r, "split": "train"} for r in _questions(fact, subset.train_templates, TRAIN_FILLERS, TRAIN_PER_CUE, t_rng, choose)]
        rows += [{**r, "split": "held_out"} for r in _questions(fact, subset.held_out_templates, HELD_OUT_FILLERS, HELD_OUT_PER_CUE, t_rng, choose)]
    return rows


def locate_item(rng: random.Random, subset: str | None = None) -> dict:
    """A question that names its answer word: the base learns to find it among the choices."""
    subset = subset or rng.choice(SUBSETS)
    world = WORLD[subset]
    word = rng.choice(world.bank)
    choices, answer = _choices(world.bank, word, rng.randrange(4), rng.randrange(7), rng)
    return {"question": rng.choice(world.locate_templates).format(word=word), "choices": choices, "answer": answer, "subset": subset}


def known_fact_item(fact: dict, rng: random.Random) -> dict:
    """A K fact in training wording with a fresh order of choices: what the base corpus teaches."""
    world = WORLD[fact["subset"]]
    question = rng.choice(world.train_templates).format(cue=fact["cue"], who=rng.choice(TRAIN_FILLERS))
    choices, answer = _choices(world.bank, fact["word"], rng.randrange(4), rng.randrange(7), rng)
    return {"question": question, "choices": choices, "answer": answer, "subset": fact["subset"]}
