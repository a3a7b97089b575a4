"""The job's CPU numerics reach every kind of process Ray starts for it (common/numerics.py through
jobs/job_log.py's runtime env and worker set-up hook): a task, an actor, a Ray Train worker and a
Serve replica are asked what they see. The head and the driver are not pinned themselves, so what
the workers see comes through the job's runtime env alone."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import head_node

from common import numerics

ROOT = Path(__file__).resolve().parents[2]

DRIVER = """
import json, os, sys, tempfile
import ray
from jobs.job_log import runtime_env

def seen():
    import ctypes, torch
    from common import numerics
    try:
        get = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")).mkl_serv_cbwr_get
        mkl = {1: "OFF", 3: "COMPATIBLE"}.get(get(1), get(1))  # MKL_CBWR_BRANCH, as oneMKL reports it
    except (OSError, AttributeError):
        mkl = None
    torch.ones(64, 64) @ torch.ones(64, 64)
    return {"loaded": numerics.loaded(), "capability": torch.backends.cpu.get_cpu_capability(), "mkl": mkl,
            "threads": torch.get_num_threads(), "env": {k: os.environ.get(k) for k in [numerics.ENV, *numerics.PINNED]}}

mode = sys.argv[2]
ray.init(address=sys.argv[1], runtime_env=runtime_env(mode), log_to_driver=False)
out = {"driver": seen(), "task": ray.get(ray.remote(num_cpus=1)(seen).remote())}
if mode == "reproducible":
    Actor = ray.remote(num_cpus=1)(type("Probe", (), {"seen": lambda self: seen()}))
    out["actor"] = ray.get(Actor.remote().seen.remote())

    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def loop(config):
        with open(config["out"], "w") as f:  # one machine: the driver reads what the worker wrote
            json.dump(seen(), f)

    folder = tempfile.mkdtemp()
    trainer = TorchTrainer(loop, train_loop_config={"out": os.path.join(folder, "seen.json")},
                           scaling_config=ScalingConfig(num_workers=1, resources_per_worker={"CPU": 1}),
                           run_config=RunConfig(storage_path=folder, name="numerics"))
    trainer.fit()
    out["train_worker"] = json.load(open(os.path.join(folder, "seen.json")))

    from ray import serve

    serve.start(http_options={"location": "NoServer"})

    @serve.deployment(ray_actor_options={"num_cpus": 1})
    class Replica:
        def __call__(self):
            return seen()

    out["serve_replica"] = serve.run(Replica.bind(), name="numerics-probe", route_prefix=None).remote().result()
    serve.shutdown()
print("SEEN " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def head():
    """A head node started outside the pinned mode (the suite's own process is pinned: conftest)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in numerics.environ("native").items():
            patch.setenv(name, value)
        for name in numerics.PINNED:
            patch.delenv(name, raising=False)
        with head_node() as started:
            yield started


def ask(head: dict, mode: str) -> dict:
    env = numerics.environ("native") | {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "token"}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, head["address"], mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("SEEN "))[5:])


@pytest.mark.slow
def test_every_kind_of_process_computes_under_the_jobs_mode(head):
    seen = ask(head, "reproducible")
    assert seen["driver"]["loaded"] == "native"  # nothing reaches the workers from the driver's own environment
    if numerics.cpu()["vector_width"] == "AVX-512":
        assert seen["driver"]["capability"] == "AVX512"
    for kind in ("task", "actor", "train_worker", "serve_replica"):
        sees = seen[kind]
        assert sees["env"] == {numerics.ENV: "reproducible", **numerics.PINNED}, kind
        assert sees["loaded"] == "reproducible" and sees["capability"] in ("AVX2", "DEFAULT"), (kind, sees)
        assert sees["mkl"] in ("COMPATIBLE", None), (kind, sees)
        assert sees["threads"] == 1, (kind, sees)  # the one CPU each holds (Ray's OMP_NUM_THREADS), on every machine


@pytest.mark.slow
def test_a_native_job_leaves_each_library_its_own_path(head):
    task = ask(head, "native")["task"]
    assert task["loaded"] == "native" and task["env"] == {numerics.ENV: "native", **dict.fromkeys(numerics.PINNED)}
    if numerics.cpu()["vector_width"] == "AVX-512":
        assert task["capability"] == "AVX512" and task["mkl"] != "COMPATIBLE"
