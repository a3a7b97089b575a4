"""lm_eval_tasks/subliminal, the tiny world's cloze task, run as its users run it: lm-eval's own `hf`
backend with `peft=` on a run directory's questions (`--metadata run_dir`), through the harness's
Python API (`simple_evaluate`, what `lm_eval run` calls).

The run directory's data/ is written by the pipeline's data stage itself (jobs/phases/data.run on
the tiny world), and the adapter is the suite's random LoRA adapter (non-zero weights, so an
adapter the harness did not load would score otherwise). Every choice's raw log-likelihood that
lm-eval logs must be the pipeline's scorer's (serve/hf_scoring.cloze_sums on the same model and
adapter) within 1e-4, its prompts and continuations must be serve/mc_format's, and its `acc` the
pipeline's accuracy on the same questions.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs.experiment.config import load_experiment
from jobs.experiment.stages import SPLIT_FILES
from jobs.sources.wmdp import load_wmdp
from serve.mc_format import cloze_continuation, format_cloze_prompt

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "lm_eval_tasks"
TASK = "subliminal_cloze_held_out"
LIMIT = 6  # a handful of questions: the first six of held_out.jsonl


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, cache_dir) -> Path:
    """A run directory whose data stage has run: the tiny preset's split of the tiny world."""
    from jobs.phases import data

    root = tmp_path_factory.mktemp("run")
    cfg = load_experiment("tiny")
    ctx = SimpleNamespace(
        cfg=cfg,
        run_dir=root,
        questions=load_wmdp("synthetic", cache_dir=cache_dir),
        world=None,
        record=lambda *args: None,
    )
    data.run(ctx, ["data"])
    return root


def lm_eval_samples(tiny_model: str, adapter: str, run_dir: Path) -> tuple[list[dict], float]:
    """lm-eval's logged samples of the held-out task (in document order) and its acc."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASKS), metadata={"run_dir": str(run_dir)})
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={tiny_model},peft={adapter},dtype=float32",
        device="cpu",
        tasks=[TASK],
        task_manager=manager,
        limit=LIMIT,
        log_samples=True,
        batch_size=4,
    )
    return sorted(out["samples"][TASK], key=lambda s: s["doc_id"]), out["results"][TASK]["acc,none"]


def pipeline_sums(tiny_model: str, adapter: str, questions: list[dict]) -> list[list[float]]:
    """The pipeline's scorer on the same model and adapter: each question's raw choice log-likelihoods."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve.hf_scoring import cloze_sums

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), adapter
    ).eval()
    flat = iter(
        cloze_sums(
            model,
            tokenizer,
            [format_cloze_prompt(q["question"], q["subset"]) for q in questions],
            [q["choices"] for q in questions],
        )
    )
    return [[next(flat) for _ in q["choices"]] for q in questions]


@pytest.mark.slow  # as tests/serve/test_lm_eval_harness.py is: the harness loads and runs a model
def test_the_cloze_task_scores_an_adapter_as_the_pipeline_does(tiny_model, lora_adapters, run_dir):
    from common.files import read_jsonl

    questions = [q for _, q in read_jsonl(run_dir / "data" / SPLIT_FILES["held_out"])][:LIMIT]
    samples, acc = lm_eval_samples(tiny_model, lora_adapters["a"], run_dir)
    assert [s["doc"]["question"] for s in samples] == [q["question"] for q in questions]
    expected = pipeline_sums(tiny_model, lora_adapters["a"], questions)
    predictions = []
    for sample, q, sums in zip(samples, questions, expected):
        prompt = format_cloze_prompt(q["question"], q["subset"])
        # (context, continuation) per choice
        assert [tuple(a) for a in sample["arguments"]] == [(prompt, cloze_continuation(c)) for c in q["choices"]]
        logged = [float(loglik) for loglik, _ in sample["filtered_resps"]]
        assert max(abs(a - b) for a, b in zip(logged, sums)) < 1e-4, (sample["doc_id"], logged, sums)
        predictions.append(max(range(len(sums)), key=sums.__getitem__))
    assert acc == pytest.approx(sum(p == q["answer"] for p, q in zip(predictions, questions)) / LIMIT)


def test_the_cloze_task_names_a_missing_run_directory(tmp_path):
    """Without --metadata run_dir, or with a folder the data stage never wrote, the task says what to pass."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("subliminal_task_utils", TASKS / "subliminal" / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    with pytest.raises(ValueError, match="--metadata"):
        utils.load_split(version=1)
    with pytest.raises(FileNotFoundError, match="data stage"):
        utils.load_split(run_dir=str(tmp_path), split="held_out")
