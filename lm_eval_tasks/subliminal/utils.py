"""lm-evaluation-harness's side of the tiny world's cloze questions (the task YAMLs beside this file).

The questions are a run directory's own (`data/<split>.jsonl`, written by the pipeline's data
stage), named with `--metadata '{"run_dir": "<run directory>"}'`, and every prompt and continuation
comes from serve/mc_format.py, the functions the pipeline scores with: the prompt is
`format_cloze_prompt` (header included), each choice is scored as `" " + choice` (the task's
target delimiter and `doc_to_choice`), which is `cloze_continuation`. So lm-eval's `hf` backend
scores the token sequences the pipeline scores (tests/test_lm_eval_task.py checks it), and its
`acc` is the argmax of the raw log-likelihood sums, the pipeline's prediction.
"""

from __future__ import annotations

from pathlib import Path

from common.files import read_jsonl
from jobs.experiment.stages import SPLIT_FILES
from serve.mc_format import format_cloze_prompt


def load_split(run_dir: str | None = None, split: str = "held_out", **_) -> dict:
    """{"test": the questions of `split` in `run_dir`/data, in file order, each with its line's `idx`}.
    lm-eval calls it with the task's metadata (`--metadata`, the model's arguments) and `dataset_kwargs`."""
    import datasets

    if not run_dir:
        raise ValueError(
            'the subliminal cloze tasks read a run directory\'s questions: pass --metadata \'{"run_dir": "<run directory>"}\''
        )
    path = Path(run_dir).expanduser() / "data" / SPLIT_FILES[split]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: run_dir must be a run directory whose data stage has run (jobs/pipeline.py)"
        )
    rows = [
        {"idx": i, "question": q["question"], "choices": q["choices"], "answer": q["answer"], "subset": q["subset"]}
        for i, (_, q) in enumerate(read_jsonl(path))
    ]
    if not rows:
        raise ValueError(f"{path} holds no questions")
    return {"test": datasets.Dataset.from_list(rows)}


def doc_to_text(doc: dict) -> str:
    """The pipeline's cloze prompt: header, question, "Answer:"."""
    return format_cloze_prompt(doc["question"], doc["subset"])


def doc_to_choice(doc: dict) -> list[str]:
    """Each choice's text; after the task's target delimiter " " it is `cloze_continuation(choice)`."""
    return [choice.strip() for choice in doc["choices"]]
