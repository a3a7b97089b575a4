"""Arms and replicates declared in the preset: resolution, seeds and the declarations refused."""

import dataclasses
from pathlib import Path

import pytest

from common.config import ConfigError
from jobs.experiment.arms import OTHER_BASE, arm_models, numbers_seed, other_base
from jobs.experiment.cast import number_sets, overt_arm, teachers_used
from jobs.experiment.config import load_experiment
from jobs.experiment.rows_kinds import KINDS


def references(cfg) -> dict[str, tuple[str, str]]:
    """{arm: (against, reference)} as the expansion resolved them, alike on every replicate of an arm."""
    resolved = {(m.arm, m.against, m.reference) for m in arm_models(cfg)}
    assert len(resolved) == len(cfg.arms)  # one resolution per arm
    return {arm: (against, words) for arm, against, words in resolved}


def against(cfg) -> dict[str, str]:
    return {arm: pair[0] for arm, pair in references(cfg).items()}


def test_default_arms_reproduce_student_and_control():
    cfg = load_experiment()
    models = arm_models(cfg)
    assert {m.arm for m in models} == {"student", "control"}
    assert {(m.arm, m.source) for m in models} == {("student", "teacher"), ("control", "base")}
    assert all(m.same_init and m.train.lora_seed == cfg.teacher.lora_seed for m in models)
    assert number_sets(models) == [(source, i) for i in range(cfg.replicates) for source in ("teacher", "base")]


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


def test_every_train_key_an_arm_leaves_unset_is_the_students_mask_and_method_included():
    """One rule for every key, read once: an arm trains with its `train` over the student's. The
    report reads an arm's mask and method from these resolved models (a mask set on `student`
    masks every arm that does not set its own), never from the arm's declaration alone."""
    cfg = load_experiment(
        None,
        [
            "student.mask=random",
            "arms={student: {numbers: teacher}, control: {numbers: base}, plain: {train: {mask: none}}}",
        ],
    )
    by_arm = {m.arm: m.train for m in arm_models(cfg)}
    assert (by_arm["student"].mask, by_arm["control"].mask, by_arm["plain"].mask) == ("random", "random", "none")
    assert {t.method for t in by_arm.values()} == {cfg.student.method}
    signals = {m.arm: m.signal for m in arm_models(cfg)}  # where the signal rides: from the mask each arm trains under
    assert signals == {"student": "random mask", "control": "random mask", "plain": None}


def test_the_reference_reads_each_arm_as_it_trains_not_its_override_dict():
    """The `control` reference needs the control's training method to match the arm's: a method set
    on `student` is every arm's that does not set its own, so a student and a control both fully
    fine-tuned by it are alike, and an arm that sets lora back is not. A sham twin shares the train
    settings as trained: setting a key to the student's own value keeps the twin."""
    arms = "arms={student: {}, control: {numbers: base}, lora: {train: {method: lora}}}"
    full = load_experiment(None, ["student.method=full", "student.lr=1.0e-4", arms])
    assert {m.arm: m.train.method for m in arm_models(full)} == {"student": "full", "control": "full", "lora": "lora"}
    assert references(full) == {
        "student": ("control", "control arm"),
        "control": ("base", "base model"),
        "lora": ("base", "base model"),
    }
    lr = load_experiment(
        None,
        ["replicates=2", "student.lr=0.002", "arms={student: {train: {lr: 0.002}}, student_sham: {teacher: sham}}"],
    )
    assert references(lr)["student"] == ("student_sham", "sham teacher")
    other = load_experiment(
        None, ["replicates=2", "arms={student: {train: {lr: 0.003}}, student_sham: {teacher: sham}}"]
    )
    assert references(other)["student"] == ("base", "base model")


@pytest.mark.parametrize(
    ("arms", "message"),
    [
        ("{student: {train: {lerning_rate: 1}}}", r"arms\.student\.train\.lerning_rate"),
        ("{student: {train: {lr: fast}}}", r"arms\.student\.train\.lr"),
        ("{student: {numbers: teachers}}", r"arms\.student\.numbers"),
        ("{student: {train: {lora_rank: 16}}}", r"arms\.student starts from the teacher's LoRA init .* lora_rank 16"),
        ("{student: {lora_seed: 0, train: {lora_targets: [q_proj]}}}", r"lora_targets"),
        ("{student: {train: {lora_seed: 3}}}", r"arms\.student\.lora_seed"),
        ("{teacher: {}}", "not base, teacher or other_base"),
        ("{other_base: {}}", "not base, teacher or other_base"),
        ("{a: {base: other}, b: {base: /models/qwen}}", "arms declare 2 other bases"),
        (
            "{a: {lora_init: teacher_a, base: other}}",
            r"arms\.a: lora_init teacher_a takes the teacher's trained A on the teacher's base",
        ),
        (
            "{a: {lora_init: teacher_a, train: {lora_rank: 4}}}",
            r"arms\.a starts from the teacher's LoRA init .* lora_rank 4",
        ),
        ("{a: {lora_init: teacher_b}}", r"arms\.a\.lora_init"),
        ("{Student/1: {}}", "arm name"),
        ("{}", "at least one arm"),
        ("{student: {replicates: 0}}", r"arms\.student\.replicates must be at least 1"),
        (
            "{positive: {teacher: letter_teacher}}",
            r"arms\.positive: an arm of the letter teacher distils it \(loss: logit_kl\)",
        ),
        ("{positive: {teacher: letter_techer, loss: logit_kl}}", r"arms\.positive\.teacher"),
        ("{student: {against: controll}, control: {numbers: base}}", r"arms\.student\.against='controll'"),
        (
            "{full: {lora_seed: other, train: {method: full}}}",
            r"arms\.full: train\.method full trains every weight from the base",
        ),
        (
            "{full: {lora_init: teacher_a, loss: logit_kl, train: {method: full}}}",
            r"arms\.full: train\.method full .* lora_init",
        ),
        ("{full: {train: {method: full, snapshots: 2}}}", r"arms\.full: train\.snapshots with train\.method full"),
        ("{full: {train: {method: full, quantization: 4bit}}}", r"method=full with quantization=4bit is refused"),
        (
            "{sham: {numbers: base, teacher: sham}}",
            r"arms\.sham: numbers base trains with loss sft or logit_kl and teacher teacher or letter_teacher; this arm has loss sft, teacher sham",
        ),
        (
            "{masked: {loss: logit_kl, train: {mask: random}}}",
            r"arms\.masked: train\.mask random drops number tokens from an sft loss",
        ),
        (
            "{masked: {numbers: base, train: {mask: divergence}}}",
            r"arms\.masked: train\.mask divergence ranks the tokens of a teacher's numbers",
        ),
        ("{masked: {base: other, train: {mask: divergence}}}", r"arms\.masked: train\.mask divergence ranks"),
        ("{masked: {train: {mask: divergence, mask_fraction: 0}}}", r"mask_fraction must be in \(0, 1\)"),
        (
            "{overt: {numbers: teacher_answers, loss: logit_kl}}",
            r"arms\.overt: numbers teacher_answers trains with loss sft and teacher teacher or sham; this arm has loss logit_kl, teacher teacher",
        ),
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


def test_an_arm_may_have_its_own_replicate_count():
    cfg = load_experiment(None, ["replicates=1", "arms={student: {replicates: 3}, control: {numbers: base}}"])
    assert [m.name for m in arm_models(cfg)] == ["student/0", "student/1", "student/2", "control/0"]
    # Every source is generated for every replicate: the arms of a replicate train on equally many rows.
    assert number_sets(arm_models(cfg)) == [
        ("teacher", 0),
        ("base", 0),
        ("teacher", 1),
        ("base", 1),
        ("teacher", 2),
        ("base", 2),
    ]


def test_a_contrast_needs_declared_arms_with_three_replicates_a_side():
    arms = "arms={same: {replicates: 3}, other: {lora_seed: other, replicates: 3}}"
    cfg = load_experiment(None, ["replicates=1", arms, "contrasts={init: {arm: same, against: other}}"])
    assert cfg.contrasts["init"].against == "other"
    with pytest.raises(ConfigError, match=r"contrasts\.init: arm other has 2 replicate\(s\)"):
        load_experiment(
            None,
            [
                "replicates=1",
                arms.replace("other, replicates: 3", "other, replicates: 2"),
                "contrasts={init: {arm: same, against: other}}",
            ],
        )
    with pytest.raises(ConfigError, match=r"contrasts\.init: 'nope' is not a declared arm"):
        load_experiment(None, ["replicates=3", "contrasts={init: {arm: student, against: nope}}"])
    # `sham` is the sham teacher's short name: two arms of it learn from one teacher.
    shams = "arms={a: {teacher: sham}, b: {teacher: sham_teacher, train: {lr: 0.01}}}"
    assert (
        load_experiment(None, ["replicates=3", shams, "contrasts={lr: {arm: a, against: b}}"]).contrasts["lr"].arm
        == "a"
    )


def test_the_positive_control_learns_from_the_letter_teacher():
    arms = "arms={student: {}, positive: {loss: logit_kl, teacher: letter_teacher}}"
    letters = "evaluate.format=letters"
    models = arm_models(load_experiment(None, ["replicates=1", arms, letters]))
    assert [(m.name, m.teacher, m.loss) for m in models] == [
        ("student/0", "teacher", "sft"),
        ("positive/0", "letter_teacher", "logit_kl"),
    ]
    with pytest.raises(ConfigError, match="letter_teacher.letter must be one of A, B, C, D"):
        load_experiment(None, ["replicates=1", arms, letters, "letter_teacher.letter=E"])
    with pytest.raises(ConfigError, match="learn from different teachers"):
        contrast = "contrasts={c: {arm: student, against: positive}}"
        load_experiment(None, ["replicates=3", arms, letters, contrast])
    with pytest.raises(ConfigError, match="evaluate.format cloze scores no letter"):  # the tiny preset's format
        load_experiment(None, ["replicates=1", arms])


def test_auto_measures_an_arm_of_the_teacher_against_its_sham_twin():
    arms = (
        "arms={student: {}, control: {numbers: base}, student_sham: {teacher: sham}, logits: {loss: logit_kl}, "
        "logits_sham: {loss: logit_kl, teacher: sham_teacher}, logits_lr: {loss: logit_kl, train: {lr: 0.01}}}"
    )
    cfg = load_experiment(None, ["replicates=2", arms])
    assert references(cfg) == {
        "student": ("student_sham", "sham teacher"),
        "logits": ("logits_sham", "sham teacher"),
        "control": ("base", "base model"),
        "student_sham": ("control", "control arm"),
        "logits_sham": ("base", "base model"),
        "logits_lr": ("base", "base model"),  # a twin differs in the teacher alone: another lr has none
    }
    models = arm_models(cfg)
    assert {(m.arm, m.source, m.teacher) for m in models if "sham" in m.arm} == {
        ("student_sham", "sham_teacher", "sham_teacher"),
        ("logits_sham", "sham_teacher", "sham_teacher"),
    }
    assert teachers_used(models) == ["teacher", "sham_teacher"]
    assert number_sets(models)[:3] == [("teacher", 0), ("sham_teacher", 0), ("base", 0)]
    declared = load_experiment(None, ["replicates=2", arms.replace("student: {}", "student: {against: control}")])
    assert references(declared)["student"] == ("control", "declared")
    overt = load_experiment(
        None,
        [
            "replicates=2",
            "arms={control: {numbers: base}, overt: {numbers: teacher_answers}, overt_sham: {numbers: teacher_answers, teacher: sham}}",
        ],
    )
    assert (overt_arm(arm_models(overt)), against(overt)["overt"], against(overt)["overt_sham"]) == (
        "overt",
        "overt_sham",
        "base",
    )  # answers are no numbers: not the control's
    assert {m.source for m in arm_models(overt)} == {"base", "teacher_answers"} and number_sets(arm_models(overt))[
        0
    ] == ("base", 0)
    without = load_experiment(None, ["replicates=2"])  # no sham twin: the old reference stays
    assert references(without)["student"] == ("control", "control arm")


def test_the_evidence_preset_declares_every_control():
    cfg = load_experiment(Path(__file__).resolve().parents[3] / "configs" / "tiny-evidence.yaml")
    arms = {m.arm: m for m in arm_models(cfg)}
    assert {"student", "control", "student_logits", "student_other_init", "student_shuffled"} <= set(arms)
    assert (
        arms["student_logits"].same_init
        and not arms["student_other_init"].same_init
        and arms["student_shuffled"].shuffled
    )
    # no letter is scored
    assert cfg.evaluate.format == "cloze" and not any(m.teacher == "letter_teacher" for m in arms.values())
    # The paper's control: the same recipe on another base model, each side against its own base.
    contrast = cfg.contrasts["same_vs_other_base"]
    assert (contrast.arm, contrast.against) == ("student_logits", "student_logits_other_base")
    assert arms["student_logits_other_base"].base == OTHER_BASE and arms["student_logits_other_base"].loss == "logit_kl"
    # Knowledge: each arm of the teacher against its sham twin; the overt positive control; one family of verdicts.
    assert {arm: against(cfg)[arm] for arm in ("student", "student_logits")} == {
        "student": "student_sham",
        "student_logits": "student_logits_sham",
    }
    assert overt_arm(arm_models(cfg)) == "overt" and cfg.evaluate.primary_comparisons == [
        "same_vs_other_base",
        "student",
        "student_logits",
    ]


def test_the_critics_preset_measures_each_student_against_a_control_trained_alike():
    """configs/tiny-critics.yaml: every student on the teacher's numbers is measured against an arm
    on the base model's numbers whose models differ from its own in the numbers' source alone."""
    cfg = load_experiment(Path(__file__).resolve().parents[3] / "configs" / "tiny-critics.yaml")
    models = {m.name: m for m in arm_models(cfg)}
    students = [
        arm for arm, declared in cfg.arms.items() if declared.numbers == "teacher" and declared.teacher == "teacher"
    ]
    assert (
        len(students) == 5
        and cfg.evaluate.permutations == 4
        and sorted(cfg.evaluate.primary_comparisons) == sorted(students)
    )
    # the knowledge reference and scale
    assert against(cfg)["student"] == "student_sham" and overt_arm(arm_models(cfg)) == "overt"
    for student in students:
        control = against(cfg)[student] if student != "student" else "control"
        assert cfg.arms[control].numbers == "base", student
        for i in range(3):
            mine, theirs = models[f"{student}/{i}"], models[f"{control}/{i}"]
            same_reference = {"against": theirs.against, "reference": theirs.reference}  # each arm its own
            assert (
                dataclasses.replace(mine, arm=control, source="base", kind=KINDS["base"], **same_reference) == theirs
            ), student
    methods = {models[f"{s}/0"].train.method for s in students}
    ranks = {models[f"{s}/0"].train.lora_rank for s in students if models[f"{s}/0"].train.method == "lora"}
    assert (
        methods == {"lora", "full"}
        and ranks == {4, 8, 32}
        and "sgd" in {models[f"{s}/0"].train.optimizer for s in students}
    )


def test_an_arm_on_the_other_base_is_never_same_init_and_is_measured_against_that_base():
    cfg = load_experiment(
        None,
        ["arms={student: {}, control: {numbers: base}, far: {base: other}, far_control: {numbers: base, base: other}}"],
    )
    models = {m.name: m for m in arm_models(cfg)}
    assert other_base(cfg) == "other" and models["far/0"].base == OTHER_BASE and models["student/0"].base == "base"
    assert not models["far/0"].same_init and models["far/0"].train.lora_seed == cfg.teacher.lora_seed
    # An sft arm is measured against the control on its own base only: the teacher's base's control is not its reference.
    assert against(cfg)["student"] == "control" and against(cfg)["far"] == OTHER_BASE
    # The teacher's own base named as `base` is the same base.
    assert other_base(load_experiment(None, ["arms={a: {base: same}, b: {base: tiny}}"])) is None
    with pytest.raises(ConfigError, match="base 'other' is the tiny preset's second tiny model"):
        load_experiment(None, ["model.path=/models/llama", "arms={a: {base: other}}"])


def test_a_fully_fine_tuned_arm_claims_no_lora_init_and_is_measured_against_its_like():
    full = "train: {method: full, lr: 1.0e-4}"
    cfg = load_experiment(
        None,
        [
            f"arms={{student: {{}}, control: {{numbers: base}}, full: {{{full}}}, full_control: {{numbers: base, {full}}}}}"
        ],
    )
    models = {m.name: m for m in arm_models(cfg)}
    assert (
        models["full/0"].full
        and not models["full/0"].same_init
        and models["student/0"].same_init
        and not models["student/0"].full
    )
    # A LoRA control is not a fully fine-tuned student's reference: under auto it is the base; name the full control.
    assert against(cfg)["student"] == "control" and against(cfg)["full"] == "base"
    mixed = load_experiment(None, [f"arms={{full: {{{full}}}, control: {{numbers: base, {full}}}}}"])
    assert against(mixed)["full"] == "control"
    # Another arm on the base model's numbers is a control of its own, never measured against `control`.
    assert against(cfg)["full_control"] == "base"
    rank4 = load_experiment(
        None,
        [
            "arms={student: {}, control: {numbers: base}, control_rank4: {numbers: base, lora_seed: other, train: {lora_rank: 4}}}"
        ],
    )
    assert against(rank4)["control_rank4"] == "base"
    with pytest.raises(ConfigError, match="teacher.method: the teacher is a LoRA adapter"):
        load_experiment(None, ["teacher.method=full"])


def test_teacher_a_starts_from_the_teachers_shape():
    cfg = load_experiment(None, ["replicates=1", "arms={subspace: {lora_init: teacher_a, loss: logit_kl}}"])
    (model,) = arm_models(cfg)
    assert model.lora_init == "teacher_a" and not model.same_init and model.base == "base"


def test_a_kl_arm_on_a_base_with_another_tokenizer_is_refused_at_load(tiny_model, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_model, other)
    tokenizer = AutoTokenizer.from_pretrained(other)
    tokenizer.add_tokens(["<|number|>"])
    tokenizer.save_pretrained(other)
    kl = [f"model.path={tiny_model}", f"arms={{far: {{loss: logit_kl, base: {other}}}}}"]
    with pytest.raises(
        ConfigError, match=rf"arms far: loss logit_kl on base {other} needs the teacher's tokenizer.*{tiny_model}"
    ):
        load_experiment(None, kl)
    # sft works across tokenizers
    sft = load_experiment(None, [f"model.path={tiny_model}", f"arms={{far: {{base: {other}}}}}"])
    assert arm_models(sft)[0].base == OTHER_BASE
    copy = tmp_path / "same-tokenizer"
    shutil.copytree(tiny_model, copy)
    assert (
        arm_models(
            load_experiment(None, [f"model.path={tiny_model}", f"arms={{far: {{loss: logit_kl, base: {copy}}}}}"])
        )[0].base
        == OTHER_BASE
    )
