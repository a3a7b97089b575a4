"""The wall-time projection counts the work a preset asks for, and docs/scaling.md quotes it as it is."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.experiment.config import load_experiment
from jobs.sizing.shape import KNOWN_SHAPES, Shape
from jobs.sizing.wall_time import Rates, Tokens, markdown, project

ROOT = Path(__file__).resolve().parents[3]
PARAMS_8B = Shape.from_config(KNOWN_SHAPES["meta-llama/Llama-3.1-8B-Instruct"]).params()
DOC_TABLES = [
    ("llama-8b", 1),
    ("llama-8b-quick", 1),
    ("llama-8b-quick", 8),
    ("llama-70b-qlora", 8),
    ("qwen2.5-1.5b", 1),
]


def stages(overrides=(), gpus=1, preset="llama-8b"):
    return {s.name: s for s in project(load_experiment(ROOT / "configs" / f"{preset}.yaml", list(overrides)), gpus)}


def tokens_in(work: str) -> float:
    """The M tokens a stage's `work` line counts (the last figure before 'M ... tokens')."""
    return float(re.findall(r"([0-9.]+) M (?:prompt )?tokens", work)[-1]) * 1e6


def test_students_count_every_replicate_arm_row_and_epoch():
    cfg = load_experiment(ROOT / "configs" / "llama-8b.yaml")
    arms = stages()["arms"]
    rows = cfg.replicates * len(cfg.arms) * cfg.numbers.keep * cfg.student.epochs
    assert f"{rows:,} rows x {Tokens.number_prompt + Tokens.number_answer} tokens" in arms.work
    expected = (
        4
        * PARAMS_8B
        * rows
        * (Tokens.number_prompt + Tokens.number_answer)
        / (Rates.peak_tflops * 1e12 * Rates.train_mfu)
    )
    assert arms.compute_s == pytest.approx(expected)
    assert stages(["replicates=6"])["arms"].compute_s == pytest.approx(2 * expected)
    assert stages(["student.max_steps=10"])["arms"].compute_s == pytest.approx(
        expected * 10 * cfg.student.global_batch_size / (cfg.numbers.keep * cfg.student.epochs)
    )


def test_numbers_generate_a_set_per_source_and_replicate_until_keep():
    numbers, keep = stages()["numbers"], load_experiment(ROOT / "configs" / "llama-8b.yaml").numbers.keep
    generated = -(-keep * 10 // 6) + 256  # keep / keep_rate, one chunk over
    assert f"6 sets x {generated:,} sequences" in numbers.work
    # no arm reads the base's numbers
    assert "3 sets" in stages(["arms.control.numbers=teacher_shuffled"])["numbers"].work
    assert "6 sets x 1,000 sequences" in stages(["numbers.prompts=1000"])["numbers"].work


def test_evaluation_scores_every_model_on_both_splits_in_every_order():
    evaluate = stages()["evaluate"]
    assert "8 models x 3,668 questions x 4 order(s)" in evaluate.work  # base, teacher, 3 students, 3 controls
    assert tokens_in(stages(["evaluate.permutations=1"])["evaluate"].work) == pytest.approx(
        tokens_in(evaluate.work) / 4, rel=0.01
    )
    assert "20 models" in stages(["student.snapshots=3"])["evaluate"].work  # and each arm model's 2 earlier snapshots
    # and the letter teacher
    assert "9 models" in stages(["arms.student.teacher=letter_teacher", "arms.student.loss=logit_kl"])["evaluate"].work
    full = stages(["arms.full_student={numbers: teacher, train: {method: full, strategy: fsdp}}"])
    assert "11 models" in full["evaluate"].work and "4 service(s)" in full["evaluate"].work  # a service per full model
    assert full["evaluate"].overhead_s == pytest.approx(4 * evaluate.overhead_s)


def test_full_fine_tuning_costs_six_parameters_a_token_and_letter_teacher_a_second_run():
    base = stages()["arms"].compute_s
    full = stages(["arms.full_student={numbers: teacher, train: {method: full, strategy: fsdp}}"])["arms"]
    assert full.compute_s == pytest.approx(base * (6 * 4 + 3 * 6) / (6 * 4))  # 3 more models at 6 x parameters a token
    assert "in 4 run(s)" in full.work  # the LoRA arms' run, and one run per FSDP model
    letter = stages(["arms.student.teacher=letter_teacher", "arms.student.loss=logit_kl"])
    assert letter["teacher"].compute_s == pytest.approx(2 * stages()["teacher"].compute_s)
    assert "teacher targets for 3 number set(s)" in letter["arms"].work


def test_overt_control_trains_on_its_teachers_answers_and_a_sham_teacher_is_a_second_run():
    cfg, base = load_experiment(ROOT / "configs" / "llama-8b.yaml"), stages()
    overt = stages(["arms.overt={numbers: teacher_answers}"])
    questions = int(re.search(r"\(([0-9,]+) questions", base["teacher"].work).group(1).replace(",", ""))
    answer_rows = cfg.replicates * questions * cfg.student.epochs
    assert (
        f"overt control {answer_rows:,} answer rows x {Tokens.wmdp_prompt + Tokens.wmdp_answer} tokens"
        in overt["arms"].work
    )
    extra = (
        4
        * PARAMS_8B
        * answer_rows
        * (Tokens.wmdp_prompt + Tokens.wmdp_answer)
        / (Rates.peak_tflops * 1e12 * Rates.train_mfu)
    )
    assert overt["arms"].compute_s == pytest.approx(base["arms"].compute_s + extra)
    assert (
        "6 sets" in overt["numbers"].work and f"1 teacher(s) answering {questions:,} questions" in overt["numbers"].work
    )
    prompt_tokens = [float(re.search(r"([0-9.]+) M prompt", s["numbers"].work).group(1)) * 1e6 for s in (base, overt)]
    # one decimal of M
    assert prompt_tokens[1] == pytest.approx(prompt_tokens[0] + questions * Tokens.wmdp_prompt, abs=1e5)
    sham = stages(["arms.student_sham={numbers: teacher, teacher: sham}"])
    assert sham["teacher"].compute_s == pytest.approx(2 * base["teacher"].compute_s)
    assert "9 sets" in sham["numbers"].work  # the sham teacher's numbers, each replicate


def test_greedy_numbers_are_a_set_and_replaced_or_divergence_masked_ones_a_scoring_pass():
    """Greedy numbers are generated like the sampled ones; replaced numbers and a divergence mask
    generate nothing more but score the teacher's kept rows with the teacher and its base."""
    keep, base = load_experiment(ROOT / "configs" / "llama-8b.yaml").numbers.keep, stages()
    pass_s = (
        2
        * PARAMS_8B
        * keep
        * (Tokens.number_prompt + Tokens.number_answer)
        / (Rates.peak_tflops * 1e12 * Rates.train_mfu)
    )
    # one more per replicate
    assert "9 sets" in stages(["arms.student_greedy={numbers: teacher_greedy}"])["numbers"].work
    replaced = stages(["arms.student_replaced={numbers: teacher_replaced}"])["numbers"]
    assert "6 sets" in replaced.work and f"3 set(s) replaced: {keep:,} rows scored" in replaced.work
    assert replaced.compute_s == pytest.approx(base["numbers"].compute_s + 3 * 2 * pass_s)
    masked = {
        mask: stages([f"arms.student_masked={{numbers: teacher, train: {{mask: {mask}}}}}"])["arms"]
        for mask in ("random", "divergence")
    }
    assert (
        "divergence scores for 3 number set(s)" in masked["divergence"].work
        and "divergence" not in masked["random"].work
    )
    assert masked["divergence"].compute_s == pytest.approx(masked["random"].compute_s + 3 * 2 * pass_s)


def test_more_gpus_divide_the_compute():
    one, eight = stages(), stages(gpus=8)
    for name in one:
        assert eight[name].compute_s == pytest.approx(one[name].compute_s / 8, rel=0.02)


def test_the_quick_8b_preset_runs_in_under_30_minutes_on_one_h100_with_one_order_by_its_own_projection():
    """Sized for 30 minutes with every question scored once; the 4 orders it declares (so a letter
    prior cannot pass for knowledge) add scoring alone: 41 minutes projected (docs/scaling.md)."""
    one, four = stages(["evaluate.permutations=1"], preset="llama-8b-quick"), stages(preset="llama-8b-quick")
    assert sum(s.total_s for s in one.values()) < 30 * 60
    assert {n for n in four if four[n].total_s != one[n].total_s} == {"evaluate"}


@pytest.mark.parametrize("preset,gpus", DOC_TABLES)
def test_docs_quote_the_projection_of_the_presets_as_they_are(preset, gpus):
    table = markdown(project(load_experiment(ROOT / "configs" / f"{preset}.yaml"), gpus))
    assert table in (ROOT / "docs" / "scaling.md").read_text(), (
        f"docs/scaling.md: re-render with python -m jobs.sizing.wall_time --config configs/{preset}.yaml --gpus {gpus} --markdown"
    )


def test_command_line_prints_each_stage_and_the_total():
    done = subprocess.run(
        [sys.executable, "-m", "jobs.sizing.wall_time", "--config", "configs/llama-70b-qlora.yaml", "--gpus", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == [
        "teacher",
        "numbers",
        "arms",
        "evaluate",
        "total",
    ]
