"""Arms and replicates declared in the preset: resolution, seeds and the declarations refused."""

import pytest

from jobs.arms import arm_models, numbers_seed, sources_used
from jobs.config import load_experiment
from train.config import ConfigError


def test_default_arms_reproduce_student_and_control():
    cfg = load_experiment()
    models = arm_models(cfg)
    assert {m.arm for m in models} == {"student", "control"}
    assert {(m.arm, m.source) for m in models} == {("student", "teacher"), ("control", "base")}
    assert all(m.same_init and m.train.lora_seed == cfg.teacher.lora_seed for m in models)
    assert sources_used(models) == ["teacher", "base"]


def test_replicates_get_their_own_data_order_and_numbers_seeds():
    cfg = load_experiment(None, ["replicates=3", "student.seed=5", "numbers.seed=11"])
    students = [m for m in arm_models(cfg) if m.arm == "student"]
    assert [m.name for m in students] == ["student/0", "student/1", "student/2"]
    assert [m.adapter for m in students] == ["student-0", "student-1", "student-2"]
    assert [m.train.seed for m in students] == [5, 6, 7]
    assert [numbers_seed(cfg, i) for i in range(3)] == [11, 12, 13]
    assert {m.train.lora_seed for m in students} == {cfg.teacher.lora_seed}  # same init for every replicate


def test_other_init_is_never_the_teachers_and_differs_per_replicate():
    cfg = load_experiment(None, ["replicates=3", "arms={student: {}, other: {lora_seed: other}}"])
    seeds = [m.train.lora_seed for m in arm_models(cfg) if m.arm == "other"]
    assert cfg.teacher.lora_seed not in seeds and len(set(seeds)) == 3
    assert not any(m.same_init for m in arm_models(cfg) if m.arm == "other")


def test_arm_train_keys_apply_to_that_arm_only():
    cfg = load_experiment(None, ["arms={student: {train: {lr: 0.01, max_steps: 3}}, control: {numbers: base}}"])
    by_arm = {m.arm: m.train for m in arm_models(cfg)}
    assert (by_arm["student"].lr, by_arm["student"].max_steps) == (0.01, 3)
    assert (by_arm["control"].lr, by_arm["control"].max_steps) == (cfg.student.lr, cfg.student.max_steps)


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ("{student: {train: {lerning_rate: 1}}}", r"arms\.student\.train\.lerning_rate"),
        ("{student: {train: {lr: fast}}}", r"arms\.student\.train\.lr"),
        ("{student: {loss: logit_kl}}", r"arms\.student\.loss=logit_kl is declared but not implemented"),
        ("{student: {numbers: teacher_shuffled}}", r"arms\.student\.numbers=teacher_shuffled is declared but not implemented"),
        ("{student: {numbers: teachers}}", r"arms\.student\.numbers"),
        ("{student: {train: {lora_rank: 16}}}", r"arms\.student starts from the teacher's LoRA init .* lora_rank 16"),
        ("{student: {lora_seed: 0, train: {lora_targets: [q_proj]}}}", r"lora_targets"),
        ("{student: {train: {lora_seed: 3}}}", r"arms\.student\.lora_seed"),
        ("{teacher: {}}", "not base or teacher"),
        ("{Student/1: {}}", "arm name"),
        ("{}", "at least one arm"),
    ],
)
def test_bad_arm_declarations_name_the_problem(arms, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(None, [f"arms={arms}"])


def test_an_arm_with_its_own_init_may_change_the_lora_shape():
    cfg = load_experiment(None, ["arms={wide: {lora_seed: 3, train: {lora_rank: 16}}}"])
    assert arm_models(cfg)[0].train.lora_rank == 16


def test_replicates_must_be_positive():
    with pytest.raises(ConfigError, match="replicates"):
        load_experiment(None, ["replicates=0"])
