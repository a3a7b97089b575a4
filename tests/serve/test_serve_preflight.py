"""`python -m serve.preflight CONFIG`: the deployment's own checks, run before `serve run`, exit 2
with one line naming the problem (a missing model, a bad adapter path, a wrong setting)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def preflight(tmp_path: Path, *, args: dict | None = None, adapters: dict | None = None, deployment: dict | None = None) -> subprocess.CompletedProcess:
    """serve/config.yaml with `args` merged into the application's, `deployment` into its deployment's
    options and `adapters` registered, checked."""
    config = yaml.safe_load((ROOT / "serve" / "config.yaml").read_text())
    (app,) = config["applications"]
    app["args"].update(args or {})
    app["deployments"][0].update(deployment or {})
    app["deployments"][0]["user_config"] = {"adapters": adapters or {}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "serve.preflight", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_servable_config_passes(tmp_path, tiny_model, lora_adapters):
    done = preflight(tmp_path, args={"model": tiny_model}, adapters={"a": lora_adapters["a"]})
    assert done.returncode == 0 and "'subliminal'" not in done.stderr and "subliminal ready to deploy" in done.stdout, done.stderr


@pytest.mark.parametrize(
    "args,adapters,named",
    [
        ({"model": "/nonexistent/model-dir"}, {}, "/nonexistent/model-dir"),
        (None, {"a": "/nonexistent/adapter"}, "adapter 'a': /nonexistent/adapter has no adapter_config.json"),
        (None, {"bad name!": "x"}, "adapter name 'bad name!'"),
        ({"max_model_len": 0}, {}, "args.max_model_len: Input should be greater than 0"),
        ({"engnie": "vllm"}, {}, "args.engnie: Extra inputs are not permitted"),
    ],
)
def test_a_config_that_would_fail_its_deployment_exits_2_with_one_line(tmp_path, tiny_model, args, adapters, named):
    done = preflight(tmp_path, args={"model": tiny_model, **(args or {})}, adapters=adapters)
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"error: {tmp_path / 'config.yaml'}: application 'subliminal': ") and named in line, line


def test_a_missing_tiny_model_names_the_command_that_builds_it(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "serve.preflight", "serve/config.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "SUBLIMINAL_CACHE": str(tmp_path / "empty-cache")},
    )
    assert done.returncode == 2 and "python -m jobs.sources.tiny_model" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_file_that_is_not_a_serve_config_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("applications: {not: a list}\n")
    done = subprocess.run([sys.executable, "-m", "serve.preflight", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"{path}: not a Serve config" in done.stderr


TP2 = {"tensor_parallel_size": 2}
BUNDLES = [{"CPU": 1, "GPU": 1}, {"GPU": 1}]


@pytest.mark.parametrize(
    "deployment,named",
    [
        ({"ray_actor_options": {"num_cpus": 1, "num_gpus": 2}}, "the replica actor holds no GPU itself"),
        ({"placement_group_bundles": [{"CPU": 1, "GPU": 2}], "placement_group_strategy": "STRICT_PACK"}, "needs 2 placement_group_bundles of one GPU each"),
        ({"placement_group_bundles": BUNDLES, "placement_group_strategy": "PACK"}, "placement_group_strategy must be STRICT_PACK"),
    ],
)
def test_a_tensor_parallel_replica_not_placed_one_gpu_bundle_per_rank_exits_2(tmp_path, tiny_model, deployment, named):
    done = preflight(tmp_path, args={"model": tiny_model, **TP2}, deployment=deployment)
    assert done.returncode == 2 and named in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_tensor_parallel_replica_placed_as_ray_llm_places_one_passes(tmp_path, tiny_model):
    placed = {"ray_actor_options": {"num_cpus": 1, "num_gpus": 0}, "placement_group_bundles": BUNDLES, "placement_group_strategy": "STRICT_PACK"}
    done = preflight(tmp_path, args={"model": tiny_model, **TP2}, deployment=placed)
    assert done.returncode == 0, done.stderr
