"""Presets that extend each other (jobs/experiment/presets.py), and the pin that keeps their stages.

`extends` only changes how a preset is written: each preset's stages must read exactly what they
read before, so stored runs are reused. `data/preset_stages.json` holds every shipped preset's
stage hashes as recorded from the flat files; a preset changed on purpose is re-pinned with

    python tests/jobs/experiment/test_presets.py
"""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from common.config import ConfigError  # noqa: E402
from jobs.experiment.arms import arm_models  # noqa: E402
from jobs.experiment.config import as_dict, load_experiment  # noqa: E402
from jobs.experiment.presets import describe_chain, find_preset, load_preset  # noqa: E402
from jobs.experiment.stages import experiment_stages  # noqa: E402
from jobs.rundir.manifest import digest  # noqa: E402

PIN = Path(__file__).parent / "data" / "preset_stages.json"
CONFIGS = ROOT / "configs"


def stage_hashes(preset: str) -> dict[str, str]:
    """Each stage's hash of what it reads from the config (the questions held fixed), and under
    `config` the hash of the whole resolved config (settings that only place work included)."""
    cfg = load_experiment(CONFIGS / preset)
    stages = {
        s.name: digest(s.reads, s.upstream) for s in experiment_stages(cfg, arm_models(cfg), questions_hash="questions")
    }
    return {**stages, "config": digest(as_dict(cfg))}


@pytest.mark.parametrize("preset", sorted(json.loads(PIN.read_text())), ids=str)
def test_presets_keep_their_stages(preset):
    pinned = json.loads(PIN.read_text())[preset]
    assert stage_hashes(preset) == pinned


def test_extends_merges_mappings_and_replaces_lists(tmp_path):
    (tmp_path / "child.yaml").write_text(
        "extends: tiny.yaml\nname: child\nteacher: {epochs: 2}\ndata: {subsets: [bio]}\narms: {extra: {numbers: teacher_shuffled}}\n"
    )
    child = load_experiment(tmp_path / "child.yaml")
    tiny = load_experiment("tiny")
    assert child.teacher.epochs == 2 and child.teacher.lr == tiny.teacher.lr  # merged key by key
    assert child.data.subsets == ["bio"]  # a list replaced whole
    assert set(child.arms) == {"student", "control", "extra"}  # the parent's arms kept
    _, chain = load_preset(tmp_path / "child.yaml")
    assert [p.name for p in chain] == ["tiny.yaml", "child.yaml"]  # a shipped parent, found by name
    assert str(tmp_path) in describe_chain(chain)


def test_extends_reads_a_sibling_before_a_shipped_preset(tmp_path):
    (tmp_path / "tiny.yaml").write_text("name: my-tiny\nreplicates: 5\n")
    (tmp_path / "child.yaml").write_text("extends: tiny.yaml\nname: child\n")
    assert load_experiment(tmp_path / "child.yaml").replicates == 5


def test_extends_loops_and_missing_parents_are_named(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match=r"loop \(a\.yaml -> b\.yaml -> a\.yaml\)"):
        load_preset(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(ConfigError, match=r"nowhere\.yaml does not exist.*tiny\.yaml"):
        load_preset(tmp_path / "c.yaml")
    (tmp_path / "d.yaml").write_text("extends: [tiny.yaml]\n")
    with pytest.raises(ConfigError, match="extends must name one preset file"):
        load_preset(tmp_path / "d.yaml")


def test_a_shipped_preset_is_found_by_name_and_a_path_is_not_guessed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # away from the checkout: names still find the shipped presets
    assert (
        find_preset("tiny-evidence") == find_preset("tiny-evidence.yaml") == (CONFIGS / "tiny-evidence.yaml").resolve()
    )
    with pytest.raises(ConfigError, match="elsewhere/tiny.yaml does not exist"):
        find_preset("elsewhere/tiny.yaml")  # a path with a folder is a path: no fallback


if __name__ == "__main__":
    presets = sorted(p.name for p in CONFIGS.glob("*.yaml"))
    PIN.write_text(json.dumps({p: stage_hashes(p) for p in presets}, indent=1, sort_keys=True) + "\n")
    print(f"pinned {len(presets)} presets in {PIN}")


def test_the_train_command_line_reads_a_preset_file_as_the_pipeline_does():
    """`python -m train --config FILE` follows `extends` by path (train.config.load_layered), with no
    import of the experiment; for a shipped preset it gets what the pipeline gets."""
    from common.config import load_layered

    for name in ("tiny-evidence.yaml", "llama-8b-quick.yaml"):
        assert load_layered(CONFIGS / name) == load_preset(CONFIGS / name)
