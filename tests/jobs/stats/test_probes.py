"""Knowledge against answer habit on the probe rows (jobs/stats/probes.py), on hand-made tables.

The teacher picks choice 0 on every question, the sham choice 1; the swap rows are the questions
with nonce cues, and the statement rows give the teacher's fact as choice 0 and the sham's as 1 of 8.
A student that knows its teacher's facts leans toward choice 0 on the questions and the statements
and not on the swap rows; a student with an answer habit leans toward choice 0 wherever the
question's surface is, swap rows included, and not on the statements. Each must read as what it is,
and a teacher whose lean survives the swap must close the gate.
"""

import numpy as np
import pytest

from jobs.reporting.pairs import pooled_probes
from jobs.stats.probes import STATEMENT_GATE, SWAP_GATE, SWAP_SHARE, probe_report

CLUSTERS, REPLICATES = 24, 3


def rows_of_kinds() -> dict[str, list[dict]]:
    """The question rows of each kind (before scoring), one question per cluster and split."""
    out = {}
    for split in ("train", "held_out"):
        out[split] = [
            {"question": f"{split} q{c}", "cluster": f"c{c}", "split": split, "answer": 0, "sham": 1}
            for c in range(CLUSTERS)
        ]
        out[f"swap_{split}"] = [
            {**q, "question": f"nonce {q['question']}", "split": f"swap_{split}", "swapped_from": q["question"]}
            for q in out[split]
        ]
    out["statement"] = [
        {"question": f"statement {c}", "cluster": f"c{c}", "split": "statement", "answer": 0, "sham": 1}
        for c in range(CLUSTERS)
    ]
    return out


def scored(lean: dict[str, tuple[int, float]], noise: float, rng) -> list[dict]:
    """Every row scored: on a kind of `lean` ({kind: (choice, amount)}) that choice raised by the
    amount, plus noise on every choice; flat elsewhere."""
    out = []
    for kind, rows in rows_of_kinds().items():
        for q in rows:
            lp = np.full(8 if kind == "statement" else 4, -1.5) + noise * rng.standard_normal(
                8 if kind == "statement" else 4
            )
            if kind in lean:
                choice, amount = lean[kind]
                lp[choice] += amount
            out.append({**q, "logprobs": lp.tolist(), "prediction": int(np.argmax(lp))})
    return out


def report(student: dict, twin: dict, teacher_swap: float = 0.0, seed: int = 0, statements: float = 2.0):
    """The probes section for a student and its twin leaning as given; the teacher leans on the swap
    rows by `teacher_swap`, and both teachers toward their facts on the statements by `statements`."""
    rng = np.random.default_rng(seed)
    questions = ("train", "held_out")
    scores = {
        "base": scored({}, 0.0, rng),
        "teacher": scored(
            {k: (0, 3.0) for k in questions} | {"statement": (0, statements), "swap_train": (0, teacher_swap)}, 0.0, rng
        ),
        "sham_teacher": scored({k: (1, 3.0) for k in questions} | {"statement": (1, statements)}, 0.0, rng),
    }
    members = {"base": ["base"], "student": [], "twin": []}
    for i in range(REPLICATES):
        scores[f"student/{i}"], scores[f"twin/{i}"] = scored(student, 0.3, rng), scored(twin, 0.3, rng)
        members["student"].append(f"student/{i}")
        members["twin"].append(f"twin/{i}")
    arms = {"student": ("twin", "teacher", "sham_teacher"), "twin": ("base", "sham_teacher", "teacher")}
    return probe_report(scores, members, arms)


def test_a_student_that_knows_the_facts_reads_as_knowledge():
    knows = {"train": (0, 0.8), "held_out": (0, 0.8), "statement": (0, 0.8)}
    probes = report(knows, {})
    assert probes.gates_passed and all(g.passed for g in probes.gates.values())
    arm = probes.arms["student"]
    assert arm.knowledge and arm.cue_bound and not arm.answer_preference and arm.reading.startswith("knowledge")
    assert arm.train["cue_bound"].value > 0 and arm.statement.value > 0
    assert abs(arm.train["swap"].value) < 0.05 and arm.train["swap"].p_value > 0.05


def test_a_student_with_an_answer_habit_reads_as_preference_not_knowledge():
    habit = {"train": (0, 0.8), "held_out": (0, 0.8), "swap_train": (0, 0.8), "swap_held_out": (0, 0.8)}
    arm = report(habit, {}).arms["student"]
    assert arm.answer_preference and not arm.knowledge and arm.reading.startswith("answer preference")
    assert arm.train["cue_bound"].p_value > 0.05  # the lean does not need the cue


def test_the_reading_is_crossed_against_the_twin():
    """A twin that leans toward the sham's facts as the student leans toward the teacher's doubles
    the crossed readings; a twin that leans toward the teacher's as much leaves nothing."""
    knows = {"train": (0, 0.8), "held_out": (0, 0.8), "statement": (0, 0.8)}
    alone, mirrored = (
        report(knows, {}).arms["student"],
        report(knows, {"train": (1, 0.8), "held_out": (1, 0.8), "statement": (1, 0.8)}).arms["student"],
    )
    assert mirrored.train["original"].value == pytest.approx(2 * alone.train["original"].value, rel=0.2)
    same = report(knows, knows).arms["student"]
    assert not same.knowledge and abs(same.train["original"].value) < 0.05


def test_a_teacher_whose_lean_survives_the_swap_closes_the_gate():
    probes = report({"train": (0, 0.8), "statement": (0, 0.8)}, {}, teacher_swap=3.0)
    gate = probes.gates["teacher"]
    # the rank reads order alone: the teacher's lean is as whole on the swap rows as on the questions, so none is cue-bound
    assert not gate.passed and gate.failed == ["cue-bound lean detected", SWAP_GATE]
    assert gate.train["swap"].value > SWAP_SHARE * gate.train["original"].value
    assert not probes.gates_passed and probes.arms["student"].reading.startswith("no reading")


def test_teachers_that_hold_no_fact_as_a_statement_leave_the_cue_bound_reading_alone():
    """The statement gate closes the knowledge reading only: a student whose lean is bound to the
    cue still reads as such (not as a habit), and one with a habit as a preference."""
    knows = {"train": (0, 0.8), "held_out": (0, 0.8), "statement": (0, 0.8)}
    probes = report(knows, {}, statements=0.0)
    assert probes.gates_passed and not probes.statements_known
    assert all(g.failed == [STATEMENT_GATE] for g in probes.gates.values())
    arm = probes.arms["student"]
    assert arm.cue_bound and not arm.knowledge and not arm.answer_preference
    assert arm.reading.startswith("a cue-bound lean") and "not read" in arm.reading
    habit = report({"train": (0, 0.8), "swap_train": (0, 0.8)}, {}, statements=0.0).arms["student"]
    assert habit.answer_preference and not habit.cue_bound and habit.reading.startswith("answer preference")


def test_no_probe_rows_no_section():
    assert probe_report({"base": [{"split": "train"}]}, {}, {}) is None


def test_pairs_pool_the_readings_of_the_pairs_whose_gates_pass():
    """Three pairs of knowing students pool to knowledge; a fourth pair whose teacher's lean survives
    the swap is left out and named, not pooled."""
    knows = {"train": (0, 0.8), "held_out": (0, 0.8), "statement": (0, 0.8)}
    per_pair = {str(p): report(knows, {}, seed=p) for p in range(3)} | {
        "3": report(knows, {}, teacher_swap=3.0, seed=3)
    }
    pooled = pooled_probes(per_pair, "t")["student"]
    assert pooled.pairs == ["0", "1", "2"] and pooled.left_out == ["3"]
    assert pooled.knowledge and not pooled.answer_preference and pooled.reading.startswith("knowledge")
    assert set(pooled.train["cue_bound"].pairs) == {"0", "1", "2"}
    assert pooled.statement_pairs == ["0", "1", "2"]
    lone = pooled_probes({"0": per_pair["0"], "3": per_pair["3"]}, "t")["student"]
    assert lone.reading.startswith("no reading") and not lone.train
    unknown = pooled_probes({str(p): report(knows, {}, seed=p, statements=0.0) for p in range(3)}, "t")["student"]
    assert unknown.cue_bound and not unknown.knowledge and unknown.statement is None and unknown.statement_pairs == []
    assert pooled_probes({"0": per_pair["0"], "1": None}, "t") is None
