"""`python -m serve.preflight CONFIG`: the deployment's own checks, run before `serve run`, exit 2
with one line naming the problem (a missing model, a bad adapter path, a wrong setting); and
`python -m serve.run CONFIG`, which runs them and then exits 1 when the build on the cluster fails."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from conftest import free_port
from serve_run_process import serve_run_started  # tests/ is on the path, as for conftest

ROOT = Path(__file__).resolve().parents[2]


def preflight(
    tmp_path: Path,
    *,
    args: dict | None = None,
    adapters: dict | None = None,
    deployment: dict | None = None,
    host: str | None = None,
    env: dict | None = None,
) -> subprocess.CompletedProcess:
    """serve/config.yaml with `args` merged into the application's, `deployment` into its deployment's
    options, `adapters` registered and the proxies on `host`, checked in the environment `env`."""
    config = yaml.safe_load((ROOT / "serve" / "config.yaml").read_text())
    config["http_options"]["host"] = host or config["http_options"]["host"]
    (app,) = config["applications"]
    app["args"].update(args or {})
    app["deployments"][0].update(deployment or {})
    app["deployments"][0]["user_config"] = {"adapters": adapters or {}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    environment = {k: v for k, v in os.environ.items() if k != "SERVE_API_KEY"} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "serve.preflight", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


def test_a_servable_config_passes(tmp_path, tiny_model, lora_adapters):
    done = preflight(tmp_path, args={"model": tiny_model}, adapters={"a": lora_adapters["a"]})
    assert done.returncode == 0 and "'subliminal'" not in done.stderr and "subliminal ready to deploy" in done.stdout, (
        done.stderr
    )


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
    assert (
        done.returncode == 2
        and "python -m jobs.sources.tiny_model" in done.stderr
        and len(done.stderr.splitlines()) == 1
    ), done.stderr


def test_a_file_that_is_not_a_serve_config_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("applications: {not: a list}\n")
    done = subprocess.run(
        [sys.executable, "-m", "serve.preflight", str(path)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and f"{path}: not a Serve config" in done.stderr


TP2 = {"tensor_parallel_size": 2}
BUNDLES = [{"CPU": 1, "GPU": 1}, {"GPU": 1}]


@pytest.mark.parametrize(
    "deployment,named",
    [
        ({"ray_actor_options": {"num_cpus": 1, "num_gpus": 2}}, "the replica actor holds no GPU itself"),
        (
            {"placement_group_bundles": [{"CPU": 1, "GPU": 2}], "placement_group_strategy": "STRICT_PACK"},
            "needs 2 placement_group_bundles of one GPU each",
        ),
        (
            {"placement_group_bundles": BUNDLES, "placement_group_strategy": "PACK"},
            "placement_group_strategy must be STRICT_PACK",
        ),
    ],
)
def test_a_tensor_parallel_replica_not_placed_one_gpu_bundle_per_rank_exits_2(tmp_path, tiny_model, deployment, named):
    done = preflight(tmp_path, args={"model": tiny_model, **TP2}, deployment=deployment)
    assert done.returncode == 2 and named in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_tensor_parallel_replica_placed_as_ray_llm_places_one_passes(tmp_path, tiny_model):
    placed = {
        "ray_actor_options": {"num_cpus": 1, "num_gpus": 0},
        "placement_group_bundles": BUNDLES,
        "placement_group_strategy": "STRICT_PACK",
    }
    done = preflight(tmp_path, args={"model": tiny_model, **TP2}, deployment=placed)
    assert done.returncode == 0, done.stderr


def test_an_open_host_without_a_token_exits_2_naming_the_host_and_the_key(tmp_path, tiny_model):
    done = preflight(tmp_path, args={"model": tiny_model}, host="0.0.0.0")
    assert (
        done.returncode == 2
        and "host 0.0.0.0 is reachable from other machines and SERVE_API_KEY is not set" in done.stderr
    ), done.stderr
    assert "http_options.host" in done.stderr and len(done.stderr.splitlines()) == 1
    assert (
        preflight(tmp_path, args={"model": tiny_model}, host="0.0.0.0", env={"SERVE_API_KEY": "k" * 16}).returncode == 0
    )
    assert preflight(tmp_path, args={"model": tiny_model, "allow_open_host": True}, host="0.0.0.0").returncode == 0
    assert preflight(tmp_path, args={"model": tiny_model}, host="::1").returncode == 0  # loopback


def open_host_config(tmp_path, tiny_model) -> tuple[Path, int]:
    """serve/config.yaml's copy bound to 0.0.0.0 on a free port, serving the tiny model."""
    port = free_port()
    config = yaml.safe_load((ROOT / "serve" / "config.yaml").read_text())
    config["http_options"].update(host="0.0.0.0", port=port)
    config["applications"][0]["args"].update(model=tiny_model, engine="hf")
    path = tmp_path / "open.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, port


def test_serve_run_of_an_open_host_without_a_token_exits_2_before_starting_anything(tmp_path, tiny_model):
    path, _ = open_host_config(tmp_path, tiny_model)
    environment = {k: v for k, v in os.environ.items() if k != "SERVE_API_KEY"}
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "serve.run", str(path)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert (
        "http_options.host" in done.stderr
        and "SERVE_API_KEY is not set" in done.stderr
        and len(done.stderr.splitlines()) == 1
    ), done.stderr
    assert time.time() - started < 60  # the preflight's answer: no Ray was started


@pytest.mark.slow  # starts Ray
def test_serve_run_on_a_cluster_that_refuses_the_build_exits_1_naming_the_setting(tmp_path, tiny_model, ray_head):
    """The key is set here, so the preflight passes, but the cluster was started without it: its
    build refuses the open host (DEPLOY_FAILED). Ray's own `serve run CONFIG` keeps running then;
    `python -m serve.run` reads the status, stops it and exits 1 with the build's reason, and
    nothing ever answered on the port."""
    path, port = open_host_config(tmp_path, tiny_model)
    environment = {**os.environ, "SERVE_API_KEY": "k" * 16, "RAY_AUTH_MODE": "token"}
    done = subprocess.run(
        [sys.executable, "-m", "serve.run", str(path), "--address", ray_head["address"]],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    reason = [line for line in done.stderr.splitlines() if line.startswith("error: application")]
    assert reason and "SERVE_API_KEY is not set" in reason[0] and "0.0.0.0" in reason[0], done.stderr[-3000:]
    with pytest.raises(requests.RequestException):
        requests.post(f"http://127.0.0.1:{port}/generate", json={"prompts": ["hi"]}, timeout=5).raise_for_status()


@pytest.mark.slow  # starts Ray
def test_serve_run_whose_proxy_cannot_start_exits_1_ending_on_why(tiny_model):
    """The config's port is held by another process: Serve's proxy cannot bind it and Ray's `serve run`
    dies in its start with a traceback; `python -m serve.run` exits with its status and ends on one
    line naming the cause (a proxy not ready in time ends the same way, naming its setting)."""
    config = yaml.safe_load((ROOT / "serve" / "config.yaml").read_text())
    config["applications"][0]["args"].update(model=tiny_model, engine="hf")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(AssertionError, match="serve run exited with 1") as failed:
            serve_run_started(config, port=port)
    assert str(failed.value).strip().splitlines()[-1] == (
        "error: serve run exited with status 1 before subliminal ran: "
        f"RuntimeError: Failed to bind to address '127.0.0.1:{port}'."
    ), str(failed.value)[-3000:]


ENDS_AS_SERVE_RUN_DOES = r"""
import sys
print("Traceback (most recent call last):", file=sys.stderr)
print("RuntimeError: Failed to bind to address '127.0.0.1:8000'.", file=sys.stderr)
for n in range(150):  # the proxy's and the controller's logs, forwarded after the driver's traceback
    print(f"\x1b[36m(ProxyActor pid=9)\x1b[0m RuntimeError: retry {n}", file=sys.stderr)
sys.exit(1)
"""


def test_the_reason_is_the_drivers_own_last_error_not_a_forwarded_actor_line():
    """`serve run`'s own traceback ends before the actors' forwarded logs do (a failing proxy's run on
    for a hundred lines): the reason is read from its own lines."""
    from serve.run import exit_reason, relay_stderr

    child = subprocess.Popen([sys.executable, "-c", ENDS_AS_SERVE_RUN_DOES], stderr=subprocess.PIPE, text=True)
    last_lines = relay_stderr(child)
    assert child.wait(30) == 1
    assert exit_reason(last_lines()) == "RuntimeError: Failed to bind to address '127.0.0.1:8000'."


START_ON_A_RUNNING_OPEN_PROXY = """
import sys
import ray
from ray import serve
from serve.launch import start_service
from serve.settings import ServiceError, ServiceSettings
ray.init(address=sys.argv[1])
serve.start(http_options={"host": "0.0.0.0", "port": int(sys.argv[3])})  # a proxy already on every address
try:
    start_service(ServiceSettings(model=sys.argv[2], engine="hf"), name="late", host="127.0.0.1", port=int(sys.argv[3]))
except ServiceError as err:
    print(f"refused: {err}")
    sys.exit(0)
sys.exit(1)
"""


@pytest.mark.slow  # starts Ray
def test_start_service_checks_the_host_the_running_proxy_binds_not_the_one_asked(tiny_model, ray_head):
    """Serve keeps the host its proxies were started on: a service asked for 127.0.0.1 on a cluster
    whose proxy already binds 0.0.0.0 is reachable from other machines, and without a token refused."""
    environment = {k: v for k, v in os.environ.items() if k != "SERVE_API_KEY"} | {"RAY_AUTH_MODE": "token"}
    done = subprocess.run(
        [sys.executable, "-c", START_ON_A_RUNNING_OPEN_PROXY, ray_head["address"], tiny_model, str(free_port())],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and "refused: host 0.0.0.0 is reachable from other machines" in done.stdout, (
        done.stdout[-2000:],
        done.stderr[-3000:],
    )
