"""`python -m serve.run CONFIG` as an operator starts it, for a test: a subprocess with a local Ray of its own.

`RAY_ADDRESS=local` and a private `RAY_TMPDIR` give it a Ray cluster of its own; `stop_serve_run` kills
it and only what it started (its children, the processes naming its folder). Ray's local
start gives the raylet a fixed 30 s to register (ray/_private/node.py); on the 2-core machine, beside
the other test process, it once took longer and serve.run's `ray.init()` failed there: such a start
(and only such) is tried again, as conftest.head_node retries a head that lost its ports.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests
import yaml
from conftest import free_port, stop_head

ROOT = Path(__file__).resolve().parents[1]
RAY_START_TIMED_OUT = "The current node timed out during startup"
LOG = "serve_run.log"  # in the folder: what serve.run printed


class RayStartTimedOut(AssertionError):
    """serve.run's local Ray did not start within Ray's own wait."""


def stop_serve_run(proc: subprocess.Popen, temp_dir: str) -> None:
    """Kill serve.run, its children as they were (taken first: an exited parent's are reparented) and every
    process naming its folder with theirs (conftest.stop_head); then the folder. No test here is of its
    own shutdown on SIGINT, which waited out `serve run`'s and Ray's (about 10 s)."""
    started = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    proc.kill()  # nothing where it has exited
    for p in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    proc.wait()
    psutil.wait_procs(started, timeout=30)
    stop_head(temp_dir)
    shutil.rmtree(temp_dir, ignore_errors=True)


def start_serve_run(config: dict, timeout_s: float = 900, port: int | None = None) -> tuple[subprocess.Popen, str, str]:
    """serve.run on `config` (a Serve config; its proxy moved to `port`, else a free one) under a new folder:
    (the process, the folder, the URL) once /health answers. Raises RayStartTimedOut where Ray's own
    start timed out, AssertionError on any other failure; what started is stopped either way. `timeout_s`
    bounds a hang: the lm-eval module's service took 131 s in the suite on one 2-core machine, over 300 s in
    the suite on one 2.7x slower (108 s alone there)."""
    temp_dir = tempfile.mkdtemp(prefix="lmh", dir="/tmp")  # short: Ray's socket paths live under it
    port = port or free_port()
    config = {**config, "http_options": {**config["http_options"], "port": port}}
    path = Path(temp_dir) / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k not in ("SERVE_API_KEY", "RAY_ADDRESS")}
    env.update(RAY_ADDRESS="local", RAY_TMPDIR=temp_dir, HF_HUB_OFFLINE="1")
    log = Path(temp_dir) / LOG
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "serve.run", str(path)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout_s
        while True:
            if proc.poll() is not None:
                said = log.read_text()
                failure = RayStartTimedOut if RAY_START_TIMED_OUT in said else AssertionError
                raise failure(f"serve run exited with {proc.returncode}:\n{said[-4000:]}")
            assert time.time() < deadline, f"the service did not answer /health within {timeout_s:.0f} s"
            try:
                if requests.get(url + "/health", timeout=5).status_code == 200:
                    return proc, temp_dir, url
            except requests.RequestException:  # not listening yet, or the proxy holds the request while the app deploys
                pass
            time.sleep(2)
    except BaseException:
        stop_serve_run(proc, temp_dir)
        raise


def serve_run_started(config: dict, tries: int = 3, **options) -> tuple[subprocess.Popen, str, str]:
    """`start_serve_run`, started again where Ray's own start timed out, at most `tries` times."""
    for _ in range(tries - 1):
        try:
            return start_serve_run(config, **options)
        except RayStartTimedOut:
            continue
    return start_serve_run(config, **options)
