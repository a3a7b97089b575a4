"""Teacher–sham pairs on one base, and the probe rows (jobs/sources/world.py, world_probes.py):
every existing row byte-identical, each pair's T facts its own under cues that echo no K cue, and
probes that change exactly what they claim to."""

import hashlib
import json
from collections import Counter

import pytest

from jobs.sources.tiny_model import TinySpec, synthetic_corpus
from jobs.sources.world import SUBSETS, WORLD, facts, name_parts, null_sham_facts, sham_facts, teacher_facts
from jobs.sources.world_probes import STATEMENTS, nonce_cues, probe_questions, statement_questions, swap_questions
from jobs.sources.world_questions import world_questions

PAIRS = (1, 2, 7)


def sha(value) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def test_pair_zero_is_the_world_as_it_was_byte_for_byte():
    """Digests of the world's rows and facts as world v4 made them before pairs existed (commit
    140380a): the kept results, the tiny base's corpus and every cached build depend on them."""
    assert sha(facts(0)) == "5a274bdb8a4ef1db"
    assert sha(world_questions(1, 2)) == "04815abfb7d622d6"
    for draw, rows, shams in ((0, "ceda3dd126ab17ea", "9cf418c537c485e3"), (2, "4389fb5281696b60", "43bff6dd62a1a4a2")):
        assert sha(world_questions(0, draw)) == sha(world_questions(0, draw, pair=0)) == rows
        assert sha([sham_facts(0, draw), null_sham_facts(0, 1, draw), null_sham_facts(0, 2, draw)]) == shams


@pytest.mark.parametrize("pair", PAIRS)
def test_a_pair_has_t_facts_of_its_own_on_the_same_k_facts(pair):
    """Pair p: the K rows (what the base knows and is checked on) are pair 0's exactly; the T facts
    are the same words under new cues that share no syllable pair with a K cue (the base knows
    those) and appear in no row of pair 0; its sham is balanced as pair 0's is."""
    base, rows = world_questions(0, 2), world_questions(0, 2, pair)
    assert [r for r in rows if r["group"] == "K"] == [r for r in base if r["group"] == "K"]
    own, first = teacher_facts(0, pair), teacher_facts(0, 0)
    assert [(f["subset"], f["word"]) for f in own] == [(f["subset"], f["word"]) for f in first]
    known = [f["cue"] for f in facts(0) if f["group"] == "K"]
    assert not name_parts([f["cue"] for f in own]) & name_parts(known)
    earlier = {f["cue"] for p in range(pair) for f in teacher_facts(0, p)}
    assert not {f["cue"] for f in own} & earlier and len({f["cue"] for f in own}) == len(own)
    t_rows = [r for r in rows if r["group"] == "T"]
    assert Counter(r["split"] for r in t_rows) == Counter(r["split"] for r in base if r["group"] == "T")
    sigma, truth = sham_facts(0, 2, pair), {f["cue"]: f["word"] for f in own}
    assert set(sigma) == set(truth) and all(sigma[c] != truth[c] for c in truth)
    for subset in SUBSETS:
        cues = [f["cue"] for f in own if f["subset"] == subset]
        assert Counter(sigma[c] for c in cues) == Counter(truth[c] for c in cues)
    assert all(r["choices"][r["sham"]] == sigma[r["cluster"].split(": ")[1]] for r in t_rows)
    assert world_questions(0, 2, pair) == rows and world_questions(0, 2, pair + 1) != rows


def test_no_pair_cue_or_nonce_is_in_the_base_corpus():
    """The base is taught K facts only: no pair's T cue and no nonce cue appears in its corpus."""
    corpus = " ".join(prompt + completion for prompt, completion in synthetic_corpus(TinySpec()))
    for pair in (0, *PAIRS):
        for cue in [f["cue"] for f in teacher_facts(0, pair)] + list(nonce_cues(0, pair).values()):
            assert cue not in corpus, (pair, cue)


@pytest.mark.parametrize("pair", (0, 2))
def test_a_swap_row_is_its_original_with_a_nonce_cue(pair):
    """One swap row per T question of the train and held-out splits: the question with only its cue
    replaced, by a nonce that echoes no cue of the world, the choices, answer, sham and cluster kept."""
    nonce = nonce_cues(0, pair)
    world_cues = [f["cue"] for f in facts(0) if f["group"] == "K"] + list(nonce)
    assert len(set(nonce.values())) == len(nonce) and not name_parts(list(nonce.values())) & name_parts(world_cues)
    originals = [r for r in world_questions(0, 2, pair) if r["group"] == "T"]
    swaps = swap_questions(0, 2, pair)
    assert len(swaps) == len(originals)
    for original, swap in zip(originals, swaps):
        cue = original["cluster"].split(": ")[1]
        assert swap["swapped_from"] == original["question"] and swap["split"] == "swap_" + original["split"]
        assert swap["question"] == original["question"].replace(cue, nonce[cue]) and cue not in swap["question"]
        assert {k: v for k, v in swap.items() if k not in ("question", "split", "probe", "swapped_from")} == {
            k: v for k, v in original.items() if k not in ("question", "split")
        }


def test_statements_state_each_fact_in_templates_used_nowhere_else():
    """Each T fact in each of its subset's two statements, over the whole bank; the statements'
    stems appear in no question of the world and no corpus item."""
    rows = statement_questions(0, 2, 0)
    sigma, truth = sham_facts(0, 2), {f["cue"]: f["word"] for f in teacher_facts(0, 0)}
    assert len(rows) == 2 * len(truth)
    for row in rows:
        cue = row["cluster"].split(": ")[1]
        assert sorted(row["choices"]) == sorted(WORLD[row["subset"]].bank)
        assert row["choices"][row["answer"]] == truth[cue] and row["choices"][row["sham"]] == sigma[cue]
        assert row["question"] in {stem.format(cue=cue) for stem in STATEMENTS[row["subset"]]}
    assert Counter(r["answer"] for r in rows).most_common(1)[0][1] < len(rows) / 4  # no letter carries the answer
    texts = [r["question"] for r in world_questions(0, 2)] + [p + c for p, c in synthetic_corpus(TinySpec())]
    stems = [stem.split("{cue}")[0] for subset in STATEMENTS.values() for stem in subset]
    assert not any(stem in text for stem in stems for text in texts)


def test_probes_leave_the_world_questions_alone():
    before = sha(world_questions(0, 2))
    rows = probe_questions(0, 2, 1)
    assert sha(world_questions(0, 2)) == before
    assert Counter(r["split"] for r in rows) == {"swap_train": 384, "swap_held_out": 192, "statement": 96}
