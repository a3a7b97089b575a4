"""The kinds of rows an arm trains on are one table (jobs/experiment/rows_kinds.py): a new kind is one
entry, plus a maker when it makes rows a new way, and every part of the experiment follows it."""

from pathlib import Path

import pytest

from common.config import ConfigError
from jobs.experiment.arms import arm_models
from jobs.experiment.cast import number_sets
from jobs.experiment.config import load_experiment
from jobs.experiment.rows_kinds import KINDS, RowsKind, declarable
from jobs.experiment.stages import experiment_stages, numbers_stage
from jobs.phases import numbers
from jobs.phases.report import numbers_made
from jobs.rundir.manifest import Manifest
from jobs.sizing.wall_time import project

ROOT = Path(__file__).resolve().parents[3]
TOY = RowsKind(
    "teacher_reversed",
    "rewritten",
    "reversed",
    derived_from="teacher",
    reads=(("numbers.max_tokens", "numbers.max_tokens"),),
    forwards_per_row=1,
    losses=("sft",),
    teachers=("teacher",),
    signal="reversed",
)


@pytest.fixture
def toy(monkeypatch):
    """The toy kind, one table entry, and its maker: the teacher's kept rows, each row's numbers reversed."""
    monkeypatch.setitem(KINDS, TOY.name, TOY)
    monkeypatch.setitem(numbers.REWRITERS, TOY.name, lambda ctx, stage, replicate: None)
    return TOY


def test_a_new_kind_is_one_entry_through_config_stages_pricing_and_report(toy, tmp_path):
    arms = "arms={student: {}, control: {numbers: base}, reversed: {numbers: teacher_reversed}}"
    cfg = load_experiment(None, [arms, "replicates=1"])
    assert "teacher_reversed" in declarable() and "teacher_reversed_shuffled" not in declarable()
    # Config check: the losses and teachers its entry allows, nothing else.
    with pytest.raises(ConfigError, match="numbers teacher_reversed trains with loss sft and teacher teacher"):
        load_experiment(None, ["arms={reversed: {numbers: teacher_reversed, loss: logit_kl}}"])
    # Arm expansion and the stage graph: made from the teacher's kept rows, after them, reading what the entry says.
    assert number_sets(arm_models(cfg)) == [("teacher", 0), ("base", 0), ("teacher_reversed", 0)]
    stages = {s.name: s for s in experiment_stages(cfg, arm_models(cfg), questions_hash="q")}
    made = stages[numbers_stage("teacher_reversed", 0)]
    assert (
        made.upstream == ("teacher", numbers_stage("teacher", 0))
        and made.reads["numbers.max_tokens"] == cfg.numbers.max_tokens
    )
    assert stages["reversed/0"].upstream == (numbers_stage("teacher_reversed", 0),)
    # Pricing: a rewritten set generates nothing; its maker's forwards are priced.
    llama = ROOT / "configs" / "llama-8b.yaml"
    plain = {
        s.name: s
        for s in project(
            load_experiment(llama, [arms.replace(", reversed: {numbers: teacher_reversed}", ""), "replicates=1"]), 1
        )
    }
    priced = {s.name: s for s in project(load_experiment(llama, [arms, "replicates=1"]), 1)}
    assert "2 sets" in priced["numbers"].work and priced["numbers"].compute_s > plain["numbers"].compute_s
    # The report's labels and the share analysis's kind.
    manifest = Manifest(tmp_path)
    for source, i in number_sets(arm_models(cfg)):
        made = {"generated": 10, "kept": 8, "rejected": {"too_short": 2}, "hash": "h"}  # as a numbers stage records
        manifest.record(numbers_stage(source, i), {}, 1.0, made)
    models = arm_models(cfg)
    assert list(numbers_made(manifest, number_sets(models), {m.source for m in models})) == [
        "teacher",
        "control",
        "reversed",
    ]
    assert {m.arm: m.signal for m in arm_models(cfg)} == {"student": None, "control": None, "reversed": "reversed"}


def test_an_undeclarable_value_names_the_choices():
    for value in ("teacher_greedy_shuffled", "sham_teacher", "techer"):
        with pytest.raises(
            ConfigError,
            match=rf"arms\.a\.numbers: '{value}' is not one of \['teacher', 'teacher_shuffled', 'teacher_greedy'",
        ):
            load_experiment(None, [f"arms={{a: {{numbers: {value}}}}}"])


def test_every_kind_is_coherent():
    """A sampled kind names its generator's teacher or the base; a rewritten one derives from an
    earlier sampled kind; a kind the sham samples for sham arms exists and allows only the sham."""
    names = list(KINDS)
    for name, kind in KINDS.items():
        assert kind.name == name
        if kind.made == "rewritten":
            assert kind.derived_from in names[: names.index(name)] and KINDS[kind.derived_from].made == "sampled"
        if kind.sham_source:
            assert KINDS[kind.sham_source].teachers == ("sham_teacher",) and not KINDS[kind.sham_source].declarable
