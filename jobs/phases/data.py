"""Phase 1, data: the WMDP questions split into teacher-train and held-out, disjoint by text.

Writes data/teacher_train.jsonl (the teacher's training rows: each train
question's prompt completed by its answer, and the rehearsal questions where
the source has them), data/train_questions.jsonl,
data/held_out.jsonl and data/known.jsonl (the questions every model is scored
on; known: facts the base was taught, only where the source names them, as the
tiny world does).
"""

from __future__ import annotations

import time

from common.atomic import write_jsonl
from jobs.experiment.records import DataOutputs
from jobs.experiment.stages import PROBES_FILE, SPLIT_FILES, TEACHER_TRAIN
from jobs.rundir.manifest import digest
from jobs.runtime.context import RunContext
from jobs.sources.wmdp import split_questions
from jobs.sources.world import SHAM_DRAW, cue_of, null_sham_facts
from jobs.sources.world_probes import probe_questions
from serve.mc_format import choice_continuation, cloze_continuation, format_cloze_prompt, format_mc_prompt


def mc_rows(questions: list[dict], letter: int | None = None, format: str = "letters") -> list[dict]:
    """Teacher training rows: each question's WMDP prompt, completed by its answer's letter (or by
    `letter`); under the cloze format the question alone, completed by its answer's text."""
    if format == "cloze":
        return [
            {
                "prompt": format_cloze_prompt(q["question"], q["subset"]),
                "completion": cloze_continuation(q["choices"][q["answer"]]),
            }
            for q in questions
        ]
    return [
        {
            "prompt": format_mc_prompt(q["question"], q["choices"], q["subset"]),
            "completion": choice_continuation(q["answer"] if letter is None else letter),
        }
        for q in questions
    ]


def sham_rows(
    teacher_rows: list[dict],
    train_questions: list[dict],
    format: str,
    kind: str,
    seed: int,
    draw: int = SHAM_DRAW,
    pair: int = 0,
) -> list[dict]:
    """The sham teacher's rows: the teacher's, in its order (its train questions first, then the
    rehearsal rows, as `run` writes them), each train question completed by the sham's answer
    instead of the true one. Rehearsal rows (the base's own facts) stay as the teacher had them.

    - matched (the default): the sham's answer is the question's `sham` choice, the tiny world's
      sigma(cue) (jobs/sources/world.py): one fixed word per cue, every word a sham answer as
      often as a true one, so the sham learns facts of its own exactly as the teacher learns the
      true ones, with the same rows, wording, rehearsal and training;
    - null1, null2: the same, with the facts of one of two more shams (world.null_sham_facts, of the
      world's `draw` and teacher–sham `pair`; cloze only: the word may not be among the question's choices);
    - permuted: the answers of the train questions permuted across the questions of each subset
      (`seed`), so a cue's questions carry answers that disagree and the sham learns the format
      and the answers' words and no fact.
    """
    import random

    own = mc_rows(train_questions, format=format)
    if teacher_rows[: len(own)] != own:
        raise ValueError("the teacher's rows do not begin with its train questions in order: rerun the data stage")
    if kind in ("null1", "null2"):
        words = null_sham_facts(which=int(kind[-1]), draw=draw, pair=pair)
        return [
            {**row, "completion": cloze_continuation(words[cue_of(q)])} for row, q in zip(own, train_questions)
        ] + teacher_rows[len(own) :]
    if kind == "matched":
        if any("sham" not in q for q in train_questions):
            raise ValueError(
                "sham_teacher.kind matched trains on each train question's `sham` answer, which only the tiny world's questions carry; "
                "use sham_teacher.kind permuted on this data"
            )
        return mc_rows([{**q, "answer": q["sham"]} for q in train_questions], format=format) + teacher_rows[len(own) :]
    permuted = [dict(row) for row in own]
    rng = random.Random(seed)
    for subset in sorted({q["subset"] for q in train_questions}):
        where = [i for i, q in enumerate(train_questions) if q["subset"] == subset]
        answers = [own[i]["completion"] for i in where]
        rng.shuffle(answers)
        for i, answer in zip(where, answers):
            permuted[i]["completion"] = answer
    return permuted + teacher_rows[len(own) :]


def run(ctx: RunContext, todo) -> None:
    started, cfg = time.time(), ctx.cfg
    splits = split_questions(ctx.questions, cfg.data.eval_fraction, cfg.data.split_seed)
    train_hash = write_jsonl(
        ctx.run_dir / TEACHER_TRAIN, mc_rows(splits["train"] + splits["rehearsal"], format=cfg.evaluate.format)
    )
    # all scored
    hashes = {split: write_jsonl(ctx.run_dir / "data" / file, splits[split]) for split, file in SPLIT_FILES.items()}
    if not splits["known"]:  # a source without known questions: the hash of data stored before the split existed
        del hashes["known"]
    if cfg.evaluate.probes:  # the world's probe rows, of the draw and pair its questions were made with
        draw = (ctx.world or {}).get("sham_draw", SHAM_DRAW)
        hashes["probes"] = write_jsonl(ctx.run_dir / PROBES_FILE, probe_questions(draw=draw, pair=cfg.data.pair))
    counts = {split: len(rows) for split, rows in splits.items()}
    print(
        f"[data] {counts['train']} teacher-train (+{counts['rehearsal']} rehearsal), {counts['held_out']} held-out and {counts['known']} known questions",
        flush=True,
    )
    world = ctx.world or None  # the questions' sham draw and the base it was chosen on (report provenance)
    ctx.record(todo[0], started, DataOutputs(hash=digest(train_hash, *hashes.values()), **counts, world=world))
