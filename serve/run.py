"""`serve run CONFIG` that stops, exit non-zero, when the application cannot serve.

    python -m serve.run serve/config.yaml                        # a local Ray of its own, as `serve run` starts one
    python -m serve.run serve/config.yaml --address HOST:6379    # a running cluster

Ray 2.60's `serve run CONFIG` submits the config and then sleeps forever, whatever the build did:
with an open host and no token, a missing model or a bad adapter path, the application is
DEPLOY_FAILED and the command keeps running with exit status 0 to come (ray/serve/scripts.py never
reads the status). This command wraps it:

1. the preflight (serve/preflight.py) runs first: a config that would fail, or an
   `http_options.host` off loopback without SERVE_API_KEY, exits 2 with one line before anything
   starts;
2. `serve run CONFIG --address ...` runs as a child with its logs on this terminal. Without
   `--address`, this process starts a local Ray first, and ends it on exit, as `serve run` would,
   with Serve's proxy body guard installed (serve/proxy_guard.py) at the config's largest
   `max_body_bytes` (a setting already in this environment wins); a cluster installs it where its
   nodes start (cluster.yaml);
3. the applications' status is read every 2 s: one line when all of them run; when one is
   DEPLOY_FAILED (the build, where Ray started, refused it: a cluster started without
   SERVE_API_KEY, say), the child is stopped (it shuts its applications down) and the command
   exits 1 naming the application and the build's error;
4. when `serve run` itself exits non-zero before the applications run, the command exits with its
   status and one last line saying why: Serve's HTTP proxy not ready within its readiness check
   (`RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S`, which the local Ray started here sets to 30 s, Serve's
   own 5 s being too short for a proxy starting on a busy machine), or the error it ended on.

Ctrl-C stops the child as it stops `serve run` itself. A failure after the applications ran
(a replica dying, say) is Serve's to repair and does not end the command.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import yaml

from common.cli import program
from serve.preflight import BUILDER, check_config
from serve.proxy_guard import CALLBACK, CALLBACK_ENV, PROXY_LIMIT_ENV
from serve.settings import ServiceError, ServiceSettings, config_args

POLL_S = 2.0
PROXY_READY_ENV = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
# A line Ray forwards from an actor's log: "(ProxyActor pid=12)" first, coloured on a terminal.
FORWARDED_ACTOR_LOG = re.compile(r"(\x1b\[[0-9;]*m)?\([^()]* pid=\d+")
LOCAL_PROXY_READY_S = "30"  # Serve gives a starting proxy 5 s; on 2 busy cores one took longer to start


def serve_cli() -> str:
    """Ray's `serve` command beside this Python, else the one on PATH."""
    beside = Path(sys.executable).parent / "serve"
    return str(beside) if beside.exists() else (shutil.which("serve") or "serve")


def watched(config: dict) -> tuple[list[str], str]:
    """Every application name in the config, and the URL its proxy binds."""
    http = config.get("http_options") or {}
    return [
        app.get("name", "default") for app in config["applications"]
    ], f"http://{http.get('host', '127.0.0.1')}:{http.get('port', 8000)}"


def guard_environment(config: dict) -> dict[str, str]:
    """The variables that install the proxy body guard in a Ray started here, its limit the largest
    `max_body_bytes` of the config's applications (one proxy serves them all)."""
    limits = [
        ServiceSettings(**config_args(app.get("args"))[0]).max_body_bytes
        for app in config["applications"]
        if app.get("import_path") == BUILDER
    ]
    return {CALLBACK_ENV: CALLBACK, **({PROXY_LIMIT_ENV: str(max(limits))} if limits else {})}


def statuses(names: list[str], since: float) -> dict[str, tuple[str, str]]:
    """{name: (status, message)} of the named applications deployed at or after `since` (an
    earlier deployment's status on a reused cluster is not this run's)."""
    from ray import serve

    try:
        applications = serve.status().applications
    except Exception:  # the controller is starting, or restarting: read again next time
        return {}
    return {
        name: (getattr(app.status, "value", app.status), app.message)
        for name, app in applications.items()
        if name in names and app.last_deployed_time_s >= since
    }


def build_error(message: str) -> str:
    """The last line of Serve's DEPLOY_FAILED message: the exception the build raised."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def relay_stderr(child: subprocess.Popen) -> Callable[[], list[str]]:
    """Copy the child's stderr to this process's, line by line, in a thread; returns a call that waits
    for the stream's end and gives its own last lines (what `serve run` ended on). The actors' log lines
    Ray forwards to it (`(ProxyActor pid=N) ...`) are left out: a failing proxy's and the controller's
    go on for a hundred lines after the driver's traceback."""
    tail: deque = deque(maxlen=60)

    def copy():
        for line in child.stderr:
            sys.stderr.write(line)
            if not FORWARDED_ACTOR_LOG.match(line):
                tail.append(line.rstrip("\n"))

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()

    def last_lines() -> list[str]:
        thread.join(timeout=10)
        return list(tail)

    return last_lines


def exit_reason(tail: list[str]) -> str:
    """Why `serve run` ended before its applications ran, read from its last lines of stderr."""
    said = "\n".join(tail)
    if "class_name: ProxyActor" in said or "HTTP proxies not available" in said:
        here = f"; {os.environ[PROXY_READY_ENV]} s in this environment" if PROXY_READY_ENV in os.environ else ""
        return (
            f"Serve's HTTP proxy was not ready within its readiness check ({PROXY_READY_ENV} seconds, "
            f"read where Ray starts{here}); on a busy machine raise it"
        )
    errors = [line.strip() for line in tail if line[:1].isalpha() and ("Error" in line or "Exception" in line)]
    return errors[-1] if errors else "see its output above"


def stop(child: subprocess.Popen) -> None:
    """SIGINT, as Ctrl-C: `serve run` then shuts its applications down; harder if it will not."""
    for send, wait_s in ((lambda: child.send_signal(signal.SIGINT), 60), (child.terminate, 15), (child.kill, 15)):
        if child.poll() is not None:
            return
        send()
        try:
            child.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue


def watch(child: subprocess.Popen, names: list[str], url: str, since: float, last_lines: Callable) -> int:
    """Exit status: 1 when an application fails to deploy, else the child's own (with its reason where
    it failed before the applications ran)."""
    announced = False
    while child.poll() is None:
        time.sleep(POLL_S)
        now = statuses(names, since)
        failed = [(name, message) for name, (status, message) in now.items() if status == "DEPLOY_FAILED"]
        if failed:
            name, message = failed[0]
            print(f"error: application {name!r} failed to deploy: {build_error(message)}", file=sys.stderr, flush=True)
            stop(child)
            return 1
        if not announced and len(now) == len(names) and all(status == "RUNNING" for status, _ in now.values()):
            print(f"serving {', '.join(names)} on {url}", flush=True)
            announced = True
    if child.returncode and not announced:
        print(
            f"error: serve run exited with status {child.returncode} before {', '.join(names)} ran: "
            f"{exit_reason(last_lines())}",
            file=sys.stderr,
            flush=True,
        )
    return child.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program("python -m serve.run"), description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="a Serve config file (serve/config.yaml or a copy)")
    parser.add_argument("--address", help="a running cluster's GCS address; default: a local Ray of this command's own")
    args = parser.parse_args(argv)
    try:
        check_config(args.config)
    except ServiceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    config = yaml.safe_load(Path(args.config).read_text())  # the preflight has read it: a Serve config
    names, url = watched(config)

    import ray

    if args.address is None:
        for name, value in guard_environment(config).items():
            os.environ.setdefault(name, value)  # the Ray started below, and its proxy, inherit them
        os.environ.setdefault(PROXY_READY_ENV, LOCAL_PROXY_READY_S)  # Serve's controller reads it
    context = ray.init(address=args.address, log_to_driver=False)
    since = time.time() - 10  # margin for a cluster clock a little behind this one
    child = subprocess.Popen(
        [serve_cli(), "run", args.config, "--address", context.address_info["gcs_address"]],
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    try:
        return watch(child, names, url, since, relay_stderr(child))
    except KeyboardInterrupt:
        stop(child)
        return 130
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
