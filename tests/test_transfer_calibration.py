"""The transfer statistics calibrated on a real model with planted effects.

A teacher: the tiny model LoRA-trained (Ray Train) on the synthetic train
questions. A planted student replicate: the teacher's adapter with its B
matrices scaled by alpha, plus replicate noise (Gaussian on B, NOISE x the
teacher's B spread, its own seed) standing in for what another training seed
changes. A control replicate: the same with alpha = 0. Each replicate is
scored once with the service's one-pass scorer on the held-out questions
(cues as clusters): a bank of CONTROLS controls and STUDENTS planted students.
Comparisons draw 3 replicates a side from the banks, DRAWS times (draws share
replicates, so the rates below are unbiased but noisier than independent
repetitions would give):

- at alpha = ALPHA_DETECTED a student trio is detected against a control trio
  on teacher_answer_logprob in at least 80% of draws;
- control trio against a disjoint control trio (alpha = 0, other seeds): at
  most 5% of draws detect anything, and the 95% CI covers 0 in at least 90%;
- a test over questions alone (`p_fixed_models`) calls most of those nulls
  significant: why the interval must hold the replicates' spread.

ALPHA_DETECTED was stated from one look at this setting's power curve on the
tiny model v2 (draws of 3 planted students against 3 controls,
teacher_answer_logprob: alpha 0.1 detected in 52%, 0.2 and 0.3 in 100%); the
statistics were not changed after it. On that look the nulls came out at 3.2%
(teacher_answer_logprob) and 1.9% (agreement) detected, coverage 97-98%, and the
test over questions alone called 55% and 13% of them significant.
(History: on tiny model v1 a first look with a bank of 24 controls and 100 draws
gave 6% on the nulls; the bank of 60 and 1000 draws gave 4.4% and 3.7%, and
alpha 0.1 was detected in every draw. A new model needs a new look.)
"""

import numpy as np
import pytest
import torch

from common.atomic import write_jsonl
from jobs.transfer_stats import cluster_ids, detected, effect, question_metrics
from jobs.wmdp import split_questions, synthetic_questions
from serve.hf_scoring import mc_logprobs
from serve.mc_format import choice_continuation, format_mc_prompt
from train.config import TrainConfig
from train.trainer import train_lora

pytestmark = pytest.mark.slow

REPLICATES, CONTROLS, STUDENTS, DRAWS, NOISE = 3, 60, 12, 1000, 0.5
ALPHA_DETECTED = 0.2
PRIMARY = ("teacher_answer_logprob", "agreement")


@pytest.fixture(scope="module")
def teacher_adapter(ray_cluster, tiny_model, tmp_path_factory, cache_dir) -> str:
    train, _ = split_questions(synthetic_questions(), 0.3, 0)
    rows = [{"prompt": format_mc_prompt(q["question"], q["choices"], q["subset"]), "completion": choice_continuation(q["answer"])} for q in train]
    root = tmp_path_factory.mktemp("calibration")
    write_jsonl(root / "teacher_train.jsonl", rows)
    cfg = TrainConfig(num_workers=1, batch_size=16, epochs=1, lr=2e-3, log_every=10, checkpoint_every=100)
    train_lora(tiny_model, root / "teacher_train.jsonl", root / "teacher", cfg, cache_dir=cache_dir)
    return str(root / "teacher")


@pytest.fixture(scope="module")
def bank(tiny_model, teacher_adapter):
    """(planted students, controls, clusters): per replicate, its per-question metrics."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), teacher_adapter).eval()
    _, questions = split_questions(synthetic_questions(), 0.3, 0)
    prompts = [format_mc_prompt(q["question"], q["choices"], q["subset"]) for q in questions]
    b_params = {name: p for name, p in model.named_parameters() if "lora_B" in name}
    teacher_b = {name: p.detach().clone() for name, p in b_params.items()}

    def scored():
        lps = mc_logprobs(model, tokenizer, prompts, [len(q["choices"]) for q in questions])
        return [{**q, "logprobs": lp, "prediction": int(np.argmax(lp))} for q, lp in zip(questions, lps)]

    teacher = scored()
    with model.disable_adapter():
        base = scored()

    def replicate(alpha: float, seed: int) -> dict:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in b_params.items():
                p.copy_(teacher_b[name] * alpha + torch.randn(p.shape, generator=generator) * teacher_b[name].std() * NOISE)
        return question_metrics(scored(), teacher, base)

    students = [replicate(ALPHA_DETECTED, 10_000 + i) for i in range(STUDENTS)]
    controls = [replicate(0.0, i) for i in range(CONTROLS)]
    return students, controls, cluster_ids(questions)


def draws(bank, metric: str, students: bool) -> list[dict]:
    """DRAWS comparisons of 3 replicates a side: planted students (or controls) against other controls."""
    planted, controls, clusters = bank
    rng = np.random.default_rng(0)
    results = []
    for _ in range(DRAWS):
        picked = rng.choice(len(controls), 2 * REPLICATES, replace=False)
        a = [planted[i] for i in rng.choice(len(planted), REPLICATES, replace=False)] if students else [controls[i] for i in picked[REPLICATES:]]
        b = [controls[i] for i in picked[:REPLICATES]]
        results.append(effect(np.array([m[metric] for m in a]), np.array([m[metric] for m in b]), clusters, binary=metric == "agreement"))
    return results


def test_a_planted_effect_is_detected_with_at_least_80_percent_power(bank):
    results = draws(bank, "teacher_answer_logprob", students=True)
    assert np.mean([detected(r) and r["value"] > 0 for r in results]) >= 0.8


@pytest.mark.parametrize("metric", PRIMARY)
def test_control_against_a_second_control_stays_a_null(bank, metric):
    results = draws(bank, metric, students=False)
    assert np.mean([detected(r) for r in results]) <= 0.05
    assert np.mean([r["ci95"][0] <= 0 <= r["ci95"][1] for r in results]) >= 0.9


def test_a_test_over_questions_alone_mistakes_seed_noise_for_an_effect(bank):
    results = draws(bank, "teacher_answer_logprob", students=False)
    assert np.mean([r["p_fixed_models"] < 0.05 for r in results]) >= 0.5
