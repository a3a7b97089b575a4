from pathlib import Path

import pytest

from common.config import ConfigError, load
from jobs.experiment.config import as_dict, load_experiment
from train.config import TrainConfig

CONFIGS = sorted((Path(__file__).resolve().parents[3] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_experiment(path)
    assert cfg.teacher.lora_seed == cfg.student.lora_seed


def test_default_is_tiny():
    cfg = load_experiment()
    assert cfg.name == "tiny" and cfg.model.path == "tiny"


def test_overrides_apply_and_parse_types():
    cfg = load_experiment(
        None,
        ["teacher.lr=0.01", "teacher.lora_targets=[q_proj]", "student.lora_targets=[q_proj]", "data.eval_fraction=0.5"],
    )
    assert cfg.teacher.lr == 0.01 and cfg.teacher.lora_targets == ["q_proj"] and cfg.data.eval_fraction == 0.5


def test_unknown_key_names_the_key():
    with pytest.raises(ConfigError, match=r"teacher\.learning_rate"):
        load_experiment(None, ["teacher.learning_rate=0.1"])


def test_wrong_type_names_the_key():
    with pytest.raises(ConfigError, match=r"teacher\.batch_size"):
        load_experiment(None, ["teacher.batch_size=big"])
    with pytest.raises(ConfigError, match=r"teacher\.strategy"):
        load_experiment(None, ["teacher.strategy=zero3"])


def test_another_student_init_is_declared_per_arm():
    with pytest.raises(ConfigError, match=r"arms\.<name>\.lora_seed"):
        load_experiment(None, ["student.lora_seed=7"])


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_experiment(tmp_path / "nope.yaml")


def test_train_section_loads_alone(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("teacher:\n  lr: 0.5\n")
    cfg = load(TrainConfig, path, ["epochs=3"], section="teacher")
    assert (cfg.lr, cfg.epochs, cfg.batch_size) == (0.5, 3, TrainConfig().batch_size)


@pytest.mark.parametrize("quantization", ["4bit", "8bit"])
def test_fsdp_over_a_quantized_base_is_refused_with_the_route_that_works(quantization):
    preset = CONFIGS[0].parent / "llama-70b-qlora.yaml"
    with pytest.raises(ConfigError, match=f"strategy=fsdp with quantization={quantization} is refused.*strategy=ddp"):
        load_experiment(preset, ["student.strategy=fsdp", f"student.quantization={quantization}"])
    bf16_fsdp = [f"{side}.{key}" for side in ("teacher", "student") for key in ("strategy=fsdp", "quantization=none")]
    assert load_experiment(preset, bf16_fsdp).student.strategy == "fsdp"


@pytest.mark.parametrize(
    "override,message",
    [
        ("numbers.temperature=3", r"numbers\.temperature: .*less than or equal to 2"),
        ("numbers.top_p=0", r"numbers\.top_p"),
    ],
)
def test_sampling_the_service_would_refuse_stops_the_run_at_load(override, message):
    """Checked by the service's request schema at load, not hours later at the numbers stage."""
    with pytest.raises(ConfigError, match=message):
        load_experiment(overrides=[override])


@pytest.mark.parametrize(
    "override,message",
    [
        ("evaluate.permutations=0", r"evaluate\.permutations must be at least 1, got 0"),
        ("student.momentum=1.0", r"momentum must be in \[0, 1\), got 1\.0"),
    ],
)
def test_scoring_orders_and_sgd_momentum_out_of_range_are_refused_at_load(override, message):
    with pytest.raises(ConfigError, match=message):
        load_experiment(overrides=[override])


def test_the_family_of_primary_verdicts_names_declared_comparisons():
    cfg = load_experiment(None, ["evaluate.primary_comparisons=[student]"])
    assert cfg.evaluate.primary_comparisons == ["student"]
    with pytest.raises(
        ConfigError,
        match=r"evaluate\.primary_comparisons: 'studnet' is neither an arm \(.*student.*\) nor a contrast \(none\)",
    ):
        load_experiment(None, ["evaluate.primary_comparisons=[studnet]"])
    with pytest.raises(ConfigError, match=r"contrasts\.student: an arm has that name too"):
        load_experiment(
            None,
            [
                "replicates=3",
                "arms={student: {}, other: {lora_seed: other}}",
                "contrasts={student: {arm: student, against: other}}",
            ],
        )


def test_a_crossed_primary_needs_a_sham_to_cross_with():
    with pytest.raises(ConfigError, match=r"evaluate\.primary_direction crossed .* declare an arm with teacher: sham"):
        load_experiment(None, ["evaluate.primary_direction=crossed"])
    cfg = load_experiment(
        None, ["evaluate.primary_direction=crossed", "arms.student_sham={numbers: teacher, teacher: sham}"]
    )
    assert cfg.evaluate.primary_direction == "crossed" and cfg.sham_teacher.kind == "matched"
    with pytest.raises(ConfigError, match="primary_direction"):
        load_experiment(None, ["evaluate.primary_direction=sideways"])


def test_a_null_sham_trains_under_cloze_only():
    assert load_experiment("tiny-confirm", ["sham_teacher.kind=null1"]).sham_teacher.kind == "null1"
    with pytest.raises(ConfigError, match="sham_teacher.kind null2 .* needs evaluate.format cloze"):
        load_experiment("tiny-confirm", ["sham_teacher.kind=null2", "evaluate.format=letters"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.subsets=[bio, 2]", "data.subsets[1]: expected a valid string, got int 2"),
        ("contrasts.c={arm: student}", "contrasts.c.against: required, not given"),
        ("tracking=yes", "tracking: expected a mapping or False or 'off', got bool True"),
        ("arms.student.lora_seed=abc", "arms.student.lora_seed: expected a valid integer or 'other', got str 'abc'"),
        ("evaluate.format=words", "evaluate.format: expected 'letters' or 'cloze', got str 'words'"),
    ],
)
def test_a_wrong_value_anywhere_is_one_line_naming_its_path(override, message):
    """The settings models' checks (pydantic) read as one line with the key's dotted path: inside
    lists and mappings, in a union's branches, and for a field that has no default."""
    with pytest.raises(ConfigError) as err:
        load_experiment(None, [override])
    assert str(err.value) == message


def test_pairs_are_two_or_more_distinct_worlds_and_each_run_is_one():
    """`pairs` lists the teacher–sham pairs a design runs over (docs/pooling.md); each pair's run is
    the same design with data.pair set, and a list that cannot be pooled is refused by name."""
    from jobs.experiment.config import pair_config

    cfg = load_experiment(None, ["pairs=[1, 2, 3]"])
    runs = [pair_config(cfg, p) for p in cfg.pairs]
    assert [r.data.pair for r in runs] == [1, 2, 3] and all(r.pairs == [] for r in runs)
    assert all(
        as_dict(r) == as_dict(cfg) | {"pairs": [], "data": as_dict(cfg)["data"] | {"pair": r.data.pair}} for r in runs
    )
    for bad, says in (
        (["pairs=[1]"], "at least two distinct"),
        (["pairs=[1, 1]"], "at least two distinct"),
        (["pairs=[1, 2]", "data.pair=1"], "leave data.pair unset"),
    ):
        with pytest.raises(ConfigError, match=says):
            load_experiment(None, bad)
    with pytest.raises(ConfigError, match="data.pair"):
        load_experiment(None, ["data.pair=-1"])


# Revision keys: each hub source pinned to one commit (jobs/experiment/pins.py) ---------------------

COMMIT = "0123456789abcdef" * 2 + "89abcdef"  # 40 hex characters
QWEN = "Qwen/Qwen2.5-7B-Instruct"


@pytest.mark.parametrize("revision", ["main", "v1.0", COMMIT[:12], COMMIT.upper(), COMMIT + "0"])
@pytest.mark.parametrize(
    "key, extra",
    [
        ("model.revision", []),
        ("data.revision", []),
        ("arms.other.base_revision", [f"arms.other={{numbers: teacher, base: {QWEN}}}"]),
    ],
)
def test_a_revision_that_can_move_or_is_no_full_commit_is_refused_naming_the_key(key, extra, revision):
    with pytest.raises(
        ConfigError,
        match=rf"^{key}: '{revision}' is not a commit hash; a branch or tag name can move to other files, so give the full 40-character",
    ):
        load_experiment("llama-8b", extra + [f"{key}={revision}"])


def test_a_revision_on_a_folder_or_a_built_source_is_refused_naming_the_key(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    refused = [
        ("tiny", [f"model.revision={COMMIT}"], r"model\.revision: model\.path 'tiny' is not read from the hub"),
        (
            "llama-8b",
            [f"model.path={tmp_path / 'model'}", f"model.revision={COMMIT}"],
            r"model\.revision: model\.path '.*model' is not read .* a folder has no revisions",
        ),
        ("tiny", [f"data.revision={COMMIT}"], r"data\.revision: data\.source 'synthetic' is not read from the hub"),
        (
            "llama-8b",
            [f"data.source={tmp_path}", f"data.revision={COMMIT}"],
            r"data\.revision: data\.source '.*' is not read from the hub .* a folder has no revisions",
        ),
        (
            "llama-8b",
            [f"arms.other={{numbers: teacher, base_revision: '{COMMIT}'}}"],
            r"arms\.other\.base_revision: the arm is on the teacher's base, which model\.revision pins",
        ),
        (
            "tiny",
            [f"arms.other={{numbers: teacher, base: other, base_revision: '{COMMIT}'}}"],
            r"arms\.other\.base_revision: arms\.other\.base 'other' is not read from the hub",
        ),
    ]
    for preset, overrides, message in refused:
        with pytest.raises(ConfigError, match=message):
            load_experiment(preset, overrides)


def test_a_pinned_source_reaches_its_readers_and_its_stages_only_when_set(tmp_path):
    """The teacher's base, the other base and the questions at their commits: the model strings every
    reader gets, and the stages' reads (the pin folded into the source's own key, absent when unset)."""
    from jobs.experiment.arms import OTHER_BASE, arm_models, base_of
    from jobs.experiment.bases import base_paths
    from jobs.experiment.stages import experiment_stages

    other = f"arms.other={{numbers: teacher, base: {QWEN}, base_revision: '{COMMIT}'}}"
    cfg = load_experiment("llama-8b", [f"model.revision={COMMIT}", f"data.revision={COMMIT}", other])
    llama = f"meta-llama/Llama-3.1-8B-Instruct@{COMMIT}"
    assert base_paths(cfg, tmp_path) == {"base": llama, OTHER_BASE: f"{QWEN}@{COMMIT}"}
    stages = {s.name: s.reads for s in experiment_stages(cfg, arm_models(cfg), "questions")}
    assert stages["teacher"]["model.path"] == llama and "model.revision" not in stages["teacher"]
    assert stages["data"]["data.source"] == f"hub@{COMMIT}" and stages["other/0"]["base"] == f"{QWEN}@{COMMIT}"
    assert stages["report"]["arms.other.base_revision"] == COMMIT
    plain = load_experiment("llama-8b")
    reads = {s.name: s.reads for s in experiment_stages(plain, arm_models(plain), "questions")}
    assert (
        reads["teacher"]["model.path"] == "meta-llama/Llama-3.1-8B-Instruct" and reads["data"]["data.source"] == "hub"
    )
    assert not [key for stage in reads.values() for key in stage if "revision" in key]  # unset: no stage reads a pin
    # the teacher's repository at another commit than model.revision is another base
    again = load_experiment(
        "llama-8b",
        [f"arms.other={{numbers: teacher, base: meta-llama/Llama-3.1-8B-Instruct, base_revision: '{COMMIT}'}}"],
    )
    assert base_of(again, "other") == OTHER_BASE and base_paths(again, tmp_path)[OTHER_BASE] == llama
    same = load_experiment(
        "llama-8b",
        [
            f"model.revision={COMMIT}",
            f"arms.other={{numbers: teacher, base: meta-llama/Llama-3.1-8B-Instruct, base_revision: '{COMMIT}'}}",
        ],
    )
    assert base_of(same, "other") == "base"
