"""The job log warns when a run reads a hub source at whatever revision the hub has today
(jobs/experiment/pins.py), and only then."""

import subprocess
import sys
from pathlib import Path

from jobs.experiment.config import load_experiment
from jobs.experiment.pins import unpinned

ROOT = Path(__file__).resolve().parents[2]


def test_hub_sources_are_named_and_built_or_local_ones_are_not(tmp_path, monkeypatch):
    llama = unpinned(load_experiment("llama-8b"))
    assert [line.split(" ")[:2] for line in llama] == [
        ["model.path", "meta-llama/Llama-3.1-8B-Instruct"],
        ["data.source", "hub"],
    ]
    assert unpinned(load_experiment("tiny")) == []  # built here: the tiny model and the synthetic questions
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "model").mkdir(parents=True)  # a local folder shaped like a hub id is local
    assert unpinned(load_experiment("tiny", ["model.path=org/model"])) == []
    snapshot = tmp_path / "hub" / "models--org--model" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    assert unpinned(load_experiment("tiny", [f"model.path={snapshot}", f"data.source={tmp_path}"])) == []


COMMIT = "0123456789abcdef" * 2 + "89abcdef"


def test_each_warning_names_its_revision_key_and_is_silent_once_it_is_set():
    other = "arms.other={numbers: teacher, base: Qwen/Qwen2.5-7B-Instruct}"
    loose = unpinned(load_experiment("llama-8b", [other]))
    assert [line.split(" ")[0] for line in loose] == ["model.path", "arms.other.base", "data.source"]
    for line, key, repo in zip(
        loose,
        ["model.revision", "arms.other.base_revision", "data.revision"],
        [
            "model_info('meta-llama/Llama-3.1-8B-Instruct')",
            "model_info('Qwen/Qwen2.5-7B-Instruct')",
            "dataset_info('cais/wmdp')",
        ],
    ):
        # the key to set, and the command that finds its commit
        assert f"pin it with {key}" in line and f"HfApi().{repo}.sha" in line
    pins = [f"model.revision={COMMIT}", f"data.revision={COMMIT}", other[:-1] + f", base_revision: '{COMMIT}'}}"]
    assert unpinned(load_experiment("llama-8b", pins)) == []
    # each key silences its own
    assert [line.split(" ")[0] for line in unpinned(load_experiment("llama-8b", pins[1:]))] == ["model.path"]


def test_the_pipeline_prints_the_warning_before_its_plan(tmp_path):
    done = subprocess.run(
        [sys.executable, "jobs/pipeline.py", "--config", "llama-8b", "--plan", "--run-dir", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        "[pins] warning: model.path meta-llama/Llama-3.1-8B-Instruct is a hub id read at the hub's newest revision; pin it with model.revision"
        in done.stdout
    ), done.stderr[-2000:]


def test_a_cluster_started_from_cluster_yaml_has_its_images_pinned_and_an_old_one_is_named():
    import copy

    import yaml

    from jobs.experiment.pins import unpinned_cluster

    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    assert unpinned_cluster(launcher) == [] and unpinned_cluster(None) == []  # not on a `ray up` head: nothing to say
    loose = copy.deepcopy(launcher)
    loose["docker"]["image"] = "rayproject/ray:2.60.0-py311-gpu"
    loose["available_node_types"]["head"]["node_config"]["ImageId"] = (
        "resolve:ssm:/aws/service/deeplearning/ami/x86_64/latest/ami-id"
    )
    del loose["available_node_types"]["gpu-1x-l40s"]["node_config"]["ImageId"]
    assert unpinned_cluster(loose) == [
        "docker.image rayproject/ray:2.60.0-py311-gpu is a tag, which can move, not a digest (cluster.yaml shows how to pin it)",
        "node type head's ImageId resolve:ssm:/aws/service/deeplearning/ami/x86_64/latest/ami-id is not a pinned ami- id",
        "node type gpu-1x-l40s's ImageId (none) is not a pinned ami- id",
    ]
    # A local autoscaling test cluster (bench/autoscale.py: provider fake_multinode) has no machine images.
    local = {"provider": {"type": "fake_multinode"}, "available_node_types": {"gpu-1x-l40s": {"node_config": {}}}}
    assert unpinned_cluster(local) == []
