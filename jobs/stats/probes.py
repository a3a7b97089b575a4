"""Knowledge told apart from answer habits: the tiny world's probe rows read (docs/report.md, "Probes").

A student that moves toward its teacher's picks may have learned facts (a cue bound to its answer)
or habits (an answer bound to the question's surface: its template, filler and shown choices). The
probe rows (jobs/sources/world_probes.py) tell them apart. Every reading is the rank metric (the
share of the other choices a model ranks below a target, jobs/stats/transfer_stats.share_below)
read crossed: a model's lean is half its rank of its teacher's target minus its rank of the
placebo's, so whatever moves both alike cancels. The targets, per row kind:

- `train`, `held_out`: each teacher's pick on the question, as every crossed metric reads it;
- `swap_<split>`: each teacher's pick on the original question (`swapped_from`): the same choices,
  the cue a nonce that names no fact;
- `statement`: each teacher's fact (the row's `answer` for the teacher, `sham` for the sham) among
  its subset's whole bank, the fact written as a statement to complete.

Readings of one side against its reference, per split: `original` (the lean on the questions),
`swap` (on the same questions with nonce cues: a lean that survives it is an answer habit) and
`cue_bound` (original minus swap, question by question: the lean the cue carries); and `statement`
(knowledge in a form no question has).

Gates, on each teacher against the base on its train questions, questions the only chance
(`p_fixed_models`). The swap gates: its cue-bound lean is detected, and its swap lean is at most
SWAP_SHARE of its original lean (a nonce carries little of a fact: nonces reuse the world's
syllables, so this is measured, not assumed). The statement gate: its statement lean is detected.
A student is read only where every teacher scored passes the swap gates, and for knowledge only
where every teacher passes the statement gate too.

The rule, fixed before the registered run read it: an arm shows *knowledge* when its cue-bound
lean on train and its statement lean are both detected toward its teacher (p < 0.05 and above 0:
an intersection-union test, level 5% without adjustment); a *cue-bound lean* when the first is; an
*answer preference* when its swap lean on train is detected toward its teacher. These readings are
secondary: no preset's family holds them. (Changed after the pairs pilot, before the registered
run: there both teachers of pair 11 passed the swap gates by far, cue-bound leans +0.25 and +0.35,
swap leans +0.04 and -0.00, and failed the statement gate, leans +0.004 and -0.004: the tiny
teachers hold their facts in the question form only. The statement gate then closed every reading;
it now closes the knowledge reading alone, and the cue-bound and answer-preference readings, which
need only the swap, are read. No threshold moved.)
"""

from __future__ import annotations

import numpy as np

from jobs.stats.results import ProbeArm, ProbeGate, Probes, Result
from jobs.stats.transfer_stats import cluster_ids, effect, share_below

SWAP_SHARE = 0.25  # a teacher's swap lean at most this share of its original lean (fixed before any probe was scored)
FACT = {"teacher": "answer", "sham_teacher": "sham"}  # each teacher's fact on a statement row
SPLITS = ("train", "held_out")
READINGS = ("original", "swap", "cue_bound")


class ProbeRows:
    """Every scored model's rows of each probe kind, and the leans read from them (module docstring)."""

    def __init__(self, scores: dict[str, list[dict]]):
        kinds = (*SPLITS, *(f"swap_{s}" for s in SPLITS), "statement")
        self.rows = {name: {k: [r for r in rows if r["split"] == k] for k in kinds} for name, rows in scores.items()}
        base = self.rows["base"]
        self.clusters = {k: cluster_ids(base[k]) for k in kinds}
        index = {s: {r["question"]: i for i, r in enumerate(base[s])} for s in SPLITS}
        self.originals = {
            s: np.array([index[s][r["swapped_from"]] for r in base[f"swap_{s}"]], dtype=int) for s in SPLITS
        }

    @staticmethod
    def present(scores: dict[str, list[dict]]) -> bool:
        return any(r["split"] == "statement" for r in scores.get("base", []))

    def targets(self, teacher: str, kind: str) -> np.ndarray:
        """The choice each row's reading aims at for `teacher` (module docstring)."""
        rows = self.rows["base"][kind]
        if kind == "statement":
            return np.array([r[FACT[teacher]] for r in rows], dtype=int)
        picks = np.array([r["prediction"] for r in self.rows[teacher][kind.removeprefix("swap_")]], dtype=int)
        return picks[self.originals[kind.removeprefix("swap_")]] if kind.startswith("swap_") else picks

    def lean(self, name: str, kind: str, teacher: str, placebo: str) -> np.ndarray:
        """Per row: half the model's rank of the teacher's target minus its rank of the placebo's."""
        own, other = self.targets(teacher, kind), self.targets(placebo, kind)
        rows = self.rows[name][kind]
        return np.array(
            [(share_below(r["logprobs"], a) - share_below(r["logprobs"], b)) / 2 for r, a, b in zip(rows, own, other)]
        )

    def reading(self, name: str, reading: str, split: str, teacher: str, placebo: str) -> np.ndarray:
        """One model's values of a reading on a split (`statement` has one, whatever the split)."""
        if reading == "statement":
            return self.lean(name, "statement", teacher, placebo)
        if reading == "original":
            return self.lean(name, split, teacher, placebo)
        swap = self.lean(name, f"swap_{split}", teacher, placebo)
        return swap if reading == "swap" else self.lean(name, split, teacher, placebo)[self.originals[split]] - swap

    def clusters_of(self, reading: str, split: str) -> np.ndarray:
        return self.clusters[
            "statement" if reading == "statement" else split if reading == "original" else f"swap_{split}"
        ]

    def compare(
        self, side: list[str], reference: list[str], teacher: str, placebo: str, fixed: bool, paired: bool
    ) -> dict:
        """Every reading of `side`'s models against `reference`'s ({train, held_out, statement})."""

        def one(reading: str, split: str) -> Result:
            a, b = (
                np.array([self.reading(n, reading, split, teacher, placebo) for n in names])
                for names in (side, reference)
            )
            return effect(a, b, self.clusters_of(reading, split), binary=False, b_fixed=fixed, paired=paired)

        out: dict = {s: {r: one(r, s) for r in READINGS} for s in SPLITS}
        return out | {"statement": one("statement", "train")}


def _toward(result: Result, fixed: bool = False) -> bool:
    """Detected toward the teacher: above 0 at p < 0.05 (for fixed models, questions the only chance)."""
    p = result.p_fixed_models if fixed else result.p_value
    return result.value is not None and result.value > 0 and p is not None and p < 0.05


SWAP_GATE = f"swap lean at most {SWAP_SHARE:g} of the original's"
STATEMENT_GATE = "statement lean detected"


def gate(rows: ProbeRows, teacher: str, placebo: str) -> ProbeGate:
    """A teacher against the base (module docstring's gates)."""
    readings = rows.compare([teacher], ["base"], teacher, placebo, fixed=True, paired=False)
    train = readings["train"]
    checks = {
        "cue-bound lean detected": _toward(train["cue_bound"], fixed=True),
        SWAP_GATE: (train["swap"].value or 0.0) <= SWAP_SHARE * (train["original"].value or 0.0),
        STATEMENT_GATE: _toward(readings["statement"], fixed=True),
    }
    failed = [name for name, held in checks.items() if not held]
    return ProbeGate(against="base", **readings, passed=not failed, failed=failed)


def decide(cue_bound: bool, preference: bool, statement: bool, gates_passed: bool, statements_known: bool) -> dict:
    """The rule (module docstring) on an arm's tests: {knowledge, cue_bound, answer_preference, reading}."""
    knowledge = gates_passed and statements_known and cue_bound and statement
    cue_bound, preference = gates_passed and cue_bound, gates_passed and preference
    return {
        "knowledge": knowledge,
        "cue_bound": cue_bound,
        "answer_preference": preference,
        "reading": sentence(knowledge, cue_bound, preference, gates_passed, statements_known),
    }


def sentence(knowledge: bool, cue_bound: bool, preference: bool, gates_passed: bool, statements_known: bool) -> str:
    if not gates_passed:
        return (
            "no reading: a teacher's lean is not bound to its cues, so the probes cannot tell knowledge from habit here"
        )
    habit = " and a lean that survives the swap (an answer preference)" if preference else ""
    if knowledge:
        return "knowledge: a cue-bound lean that carries to the statements" + habit
    if not statements_known:
        unread = " (knowledge beyond the question form not read: the teachers do not hold their facts as statements)"
        if cue_bound:
            return "a cue-bound lean: the teacher's facts in the question form, not an answer habit" + habit + unread
        return (
            "answer preference: a lean that survives the swap"
            if preference
            else "neither a cue-bound lean nor an answer preference detected"
        ) + unread
    if cue_bound:
        return "a cue-bound lean that does not carry to the statements" + habit
    return "answer preference: a lean that survives the swap" if preference else "neither detected"


def arm_reading(
    rows: ProbeRows,
    side: list[str],
    against: str,
    reference: list[str],
    teacher: str,
    placebo: str,
    gates: tuple[bool, bool],
) -> ProbeArm:
    """An arm against its reference: the readings, and what they show under the rule (`gates`: the
    swap gates and the statement gate passed by every teacher)."""
    fixed = against in ("base", "other_base")
    readings = rows.compare(
        side, reference, teacher, placebo, fixed=fixed, paired=not fixed and len(side) == len(reference)
    )
    tests = (
        _toward(readings["train"]["cue_bound"]),
        _toward(readings["train"]["swap"]),
        _toward(readings["statement"]),
    )
    return ProbeArm(against=against, **readings, **decide(*tests, *gates))


def probe_report(
    scores: dict[str, list[dict]], members: dict[str, list[str]], arms: dict[str, tuple[str, str, str | None]]
) -> Probes | None:
    """report.json's `probes`, or None where no probe rows were scored. `members`: each side's
    scored models (an arm's replicates, a base or teacher itself); `arms`: {arm: (its reference, its
    teacher, the placebo teacher or None)}, each on its reference's base (the leans compare levels);
    an arm with no placebo has no reading."""
    if not ProbeRows.present(scores):
        return None
    rows = ProbeRows(scores)
    teachers = {t for _, t, placebo in arms.values() if placebo for t in (t, placebo)}
    gates = {t: gate(rows, t, "sham_teacher" if t == "teacher" else "teacher") for t in sorted(teachers) if t in FACT}
    passed = bool(gates) and all(not set(g.failed) - {STATEMENT_GATE} for g in gates.values())
    known = bool(gates) and all(STATEMENT_GATE not in g.failed for g in gates.values())
    readings = {
        arm: arm_reading(rows, members[arm], against, members[against], teacher, placebo, (passed, known))
        for arm, (against, teacher, placebo) in arms.items()
        if placebo in FACT and teacher in FACT and against in members
    }
    return Probes(swap_share=SWAP_SHARE, gates=gates, gates_passed=passed, statements_known=known, arms=readings)
