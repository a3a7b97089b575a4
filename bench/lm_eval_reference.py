"""lm-evaluation-harness as the outside reference for multiple-choice scoring.

Our scorer (`serve.hf_scoring.mc_logprobs`) takes one forward per question; the
harness takes one request per choice. Running the harness itself (the `lm-eval`
package, its `hf` backend, as a subprocess) on the same local model, adapter and
questions checks that our predictions are the ones it would publish, and gives
its wall time for comparison.

No hub access here, so the task is a custom YAML over a local JSONL. It is the
harness's WMDP task: zero-shot, `multiple_choice`, choices "A".."D" scored as
continuations " A".." D" (target delimiter " ") after a prompt ending in
"Answer:", prediction = argmax of the log-likelihoods (`acc`). The prompt text,
header "...about biology." included, is precomputed by `format_mc_prompt`, which
reproduces the task's `description` + `doc_to_text`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from serve.mc_format import format_mc_prompt

TASK = "wmdp_local_reference"
TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
num_fewshot: 0
output_type: multiple_choice
doc_to_text: "{{{{prompt}}}}"
doc_to_choice: ["A", "B", "C", "D"]
doc_to_target: answer
target_delimiter: " "
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1
"""


def write_task(questions: list[dict], workdir: Path) -> Path:
    """Write questions.jsonl and the task YAML into workdir/task; return that folder."""
    task_dir = Path(workdir) / "task"
    task_dir.mkdir(parents=True, exist_ok=True)
    data = task_dir / "questions.jsonl"
    with data.open("w") as f:
        for i, q in enumerate(questions):
            if len(q["choices"]) != 4:
                raise ValueError(f"question {i}: the WMDP task has 4 choices, got {len(q['choices'])}")
            prompt = format_mc_prompt(q["question"], q["choices"], q["subject"])
            answer = int(q.get("answer", 0))  # only lm-eval's own acc uses it, not the predictions
            f.write(json.dumps({"idx": i, "prompt": prompt, "answer": answer}) + "\n")
    (task_dir / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=json.dumps(str(data.resolve()))))
    return task_dir


def read_predictions(output_dir: Path, n: int) -> list[int]:
    """Per-question argmax over the logged choice log-likelihoods, in input order."""
    files = sorted(Path(output_dir).rglob(f"samples_{TASK}_*.jsonl"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise RuntimeError(f"lm-eval wrote no samples file under {output_dir}")
    preds: list[int | None] = [None] * n
    for line in files[-1].read_text().splitlines():
        sample = json.loads(line)
        logliks = [float(resp[0]) for resp in sample["filtered_resps"]]  # [loglik, is_greedy] per choice
        preds[sample["doc"]["idx"]] = max(range(len(logliks)), key=logliks.__getitem__)
    missing = [i for i, p in enumerate(preds) if p is None]
    if missing:
        raise RuntimeError(f"lm-eval logged no sample for {len(missing)} questions, e.g. {missing[:5]}")
    return preds  # type: ignore[return-value]


def run_lm_eval(
    model_path: str, adapter_path: str | None, questions: list[dict], workdir: Path, batch_size: int = 16
) -> tuple[list[int], float]:
    """Run lm-eval (hf backend, float32, CPU) on `questions`; return (predictions, wall seconds).

    Each question has question, choices (4 strings), answer (0-based; optional, it
    feeds only lm-eval's own acc) and subject (bio/chem/cyber). Predictions are in
    input order; the wall time is the subprocess's, its start-up included.
    """
    workdir = Path(workdir)
    task_dir = write_task(questions, workdir)
    output_dir = workdir / "lm_eval_output"
    model_args = f"pretrained={model_path},dtype=float32"
    if adapter_path:
        model_args += f",peft={adapter_path}"
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        "hf",
        "--model_args",
        model_args,
        "--device",
        "cpu",
        "--tasks",
        TASK,
        "--include_path",
        str(task_dir),
        "--batch_size",
        str(batch_size),
        "--log_samples",
        "--output_path",
        str(output_dir),
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(workdir / "hf_datasets_cache"),
    }
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    (workdir / "lm_eval.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.splitlines()[-40:])
        raise RuntimeError(f"lm-eval exited with {proc.returncode}: {' '.join(cmd)}\n{tail}")
    return read_predictions(output_dir, len(questions)), seconds
