"""The tiny preset on a local autoscaling cluster whose worker node types mirror cluster.yaml's.

    python bench/autoscale.py [--reference RUN_DIR] [--out DIR] [--idle-minutes 0.5] [--smoke]

Ray's `fake_multinode` provider (its documented way to test autoscaling on one machine) runs the
autoscaler on a local head and starts each node it adds as a raylet of its own on this machine.
The node-type section comes from cluster.yaml itself (`stand_in_config`): the same worker types,
their `min_workers`/`max_workers`, the global `max_workers` and `upscaling_speed`; each worker
type a CPU stand-in with one CPU for each of its GPUs (the tiny preset asks one CPU per training
worker and Serve replica where the GPU presets ask one GPU): gpu-8x-h100 8 CPUs, gpu-1x-l40s 1.
The head takes no work (0 CPUs, as on a cluster whose head runs the driver only), so every CPU the
pipeline asks for is a node the autoscaler must add. The idle timeout is short (`--idle-minutes`),
so nodes idle between phases may go and come back, and after the run the bench waits for every
worker node to go.

The head is started as `ray.cluster_utils.AutoscalingCluster` starts it (`RAY_FAKE_CLUSTER=1 ray
start --head --autoscaling-config=...`), not with that class: its start and shutdown run `ray stop
--force`, which ends every Ray process on the machine. Here every port is its own, its files live
under a temporary folder of its own, and teardown kills only the processes naming that folder and
their children (tests/conftest.py `stop_head`): the nodes the autoscaler started share the head's
temporary folder, so they go too.

The pipeline runs as a user runs it (`python jobs/pipeline.py` with RAY_ADDRESS, bench/multinode.py
`run_pipeline`); it reads the node types from the config the autoscaler runs with (train/cluster.py
`load_launcher_config`) and sizes its requests to them. The reference is the one-node run
(bench/multinode.py `one_node`, run after the autoscaled one, or `--reference`), compared the same way (timings, timeline and
provenance aside). `--smoke` runs three 1-CPU tasks instead of the pipeline: the cluster's start,
scale-up, scale-down and teardown alone (written for checking the cluster; its one run here failed at connecting, before token auth was set, and it has not been run since).

The last line printed is a JSON object: the nodes the autoscaler added per type (its log,
monitor.log), the job log's autoscaler lines, every worker node with its type, the nodes used per
phase (Ray's actor table, bench/multinode.py `node_use`), the worker nodes alive after the idle
wait, the nodes the dashboard lists, the seconds, and whether the report equals the one-node one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))  # run as `python bench/autoscale.py`: bench/ stays first
sys.path.insert(2, str(ROOT / "tests"))  # conftest's free_port and stop_head, one copy of each

from conftest import free_port, stop_head  # noqa: E402
from multinode import NODE_BYTES, against_reference, node_use, one_node, run_pipeline  # noqa: E402

TOKEN = Path.home() / ".ray" / "auth_token"
HEAD_TYPE = "ray.head.default"  # the type the fake provider tags its head with
HEAD = "node:__internal_head__"  # the resource Ray gives the head node alone
ADDED = re.compile(r"Adding (\d+) node\(s\) of type (\S+?)\.")  # the autoscaler's event (node_launcher.py)
REMOVED = re.compile(r"Removing (\d+) nodes of type (\S+) \((\w+)\)")  # ... and autoscaler.py's


def stand_in_config(launcher: dict, gcs_address: str, idle_minutes: float) -> dict:
    """A fake_multinode autoscaling config from a cluster launcher config (cluster.yaml): its worker
    types, bounds and upscaling speed, each type a CPU stand-in of one CPU per GPU (at least one)."""
    head = launcher["head_node_type"]
    types = {HEAD_TYPE: {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0}}
    for name, node in launcher["available_node_types"].items():
        if name != head:
            cpus = max(1, int(node.get("resources", {}).get("GPU", 0)))
            resources = {"CPU": cpus, "object_store_memory": NODE_BYTES}
            types[name] = {
                "resources": resources,
                "node_config": {},
                "min_workers": node.get("min_workers", 0),
                "max_workers": node["max_workers"],
            }
    provider = {
        "type": "fake_multinode",
        "use_node_id_as_ip": True,
        "disable_node_updaters": True,
        "disable_launch_config_check": True,
    }
    return {
        "cluster_name": f"{launcher['cluster_name']}-stand-in",
        "max_workers": launcher["max_workers"],
        "upscaling_speed": launcher.get("upscaling_speed", 1.0),
        "idle_timeout_minutes": idle_minutes,
        "provider": provider | {"gcs_address": gcs_address},  # where the nodes it starts join: this head, not port 6379
        "available_node_types": types,
        "head_node_type": HEAD_TYPE,
        "auth": {},
        "docker": {},
        "file_mounts": {},
        **{
            key: []
            for key in ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands")
        },
        **{key: [] for key in ("head_start_ray_commands", "worker_start_ray_commands", "cluster_synced_files")},
    }


@contextlib.contextmanager
def autoscaling_cluster(launcher: dict, idle_minutes: float):
    """A fake_multinode head of 0 CPUs on ports of its own; yields {address, dashboard, temp_dir, config}."""
    from ray._private.services import get_node_ip_address

    ray = str(Path(sys.executable).parent / "ray")
    # a fresh machine where no token-mode driver ran yet: make the token (as conftest's head_node)
    if not TOKEN.is_file():
        subprocess.run([ray, "get-auth-token", "--generate"], capture_output=True, timeout=120, check=True)
    temp_dir = tempfile.mkdtemp(prefix="as", dir="/tmp")  # short: Ray's socket paths live under it
    port, dashboard, metrics, agent, client = (free_port() for _ in range(5))
    config = stand_in_config(launcher, f"{get_node_ip_address()}:{port}", idle_minutes)
    config_path = Path(temp_dir) / "autoscaling.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}  # as AutoscalingCluster.start
    command = [
        ray,
        "start",
        "--head",
        f"--port={port}",
        "--num-cpus=0",
        f"--object-store-memory={NODE_BYTES}",
        f"--temp-dir={temp_dir}",
    ]
    command += [
        f"--autoscaling-config={config_path}",
        "--disable-usage-stats",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}",
    ]
    command += [
        f"--metrics-export-port={metrics}",
        f"--dashboard-agent-listen-port={agent}",
        f"--ray-client-server-port={client}",
    ]
    try:
        started = subprocess.run(command, capture_output=True, text=True, timeout=180, env=env)
        if started.returncode != 0:
            raise RuntimeError(f"ray start --head failed:\n{started.stdout[-2000:]}\n{started.stderr[-2000:]}")
        yield {
            "address": f"127.0.0.1:{port}",
            "dashboard": f"http://127.0.0.1:{dashboard}",
            "temp_dir": temp_dir,
            "config": config,
        }
    finally:
        stop_head(temp_dir)  # its processes and the nodes the autoscaler started (they name its folder), no one else's


def node_table(address: str, config: dict) -> list[dict]:
    """Every node the cluster has had (alive or gone): id, type, alive. A node's type is its
    `ray.io/node-group` label where Ray sets one, else the stand-in type whose CPUs it has."""
    import ray

    by_cpus = {t["resources"]["CPU"]: name for name, t in config["available_node_types"].items() if name != HEAD_TYPE}
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        nodes = ray.nodes()
    finally:
        ray.shutdown()
    table = []
    for node in nodes:
        kind = (node.get("Labels") or {}).get("ray.io/node-group") or by_cpus.get(
            node["Resources"].get("CPU", 0.0), "?"
        )
        table.append(
            {"id": node["NodeID"], "type": HEAD_TYPE if HEAD in node["Resources"] else kind, "alive": node["Alive"]}
        )
    return table


def wait_idle_gone(address: str, seconds: float) -> tuple[int, float]:
    """(worker nodes alive, seconds waited): polled until none is left or `seconds` pass."""
    import ray

    started = time.time()
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        while True:
            alive = sum(1 for n in ray.nodes() if n["Alive"] and HEAD not in n["Resources"])
            if not alive or time.time() - started > seconds:
                return alive, time.time() - started
            time.sleep(2)
    finally:
        ray.shutdown()


def autoscaler_events(temp_dir: str) -> dict:
    """Nodes added and removed per type, from the autoscaler's own log (monitor.log)."""
    # session_latest: the one session, not also its link
    log = Path(temp_dir) / "session_latest" / "logs" / "monitor.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    added: dict[str, int] = {}
    removed: dict[str, int] = {}
    for count, kind in ADDED.findall(text):
        added[kind] = added.get(kind, 0) + int(count)
    for count, kind, _ in REMOVED.findall(text):
        removed[kind] = removed.get(kind, 0) + int(count)
    return {"added": added, "removed": removed}


def dashboard_nodes(url: str) -> dict:
    """What the dashboard lists (its /nodes API, which the Cluster page shows): nodes by state."""
    request = urllib.request.Request(
        f"{url}/nodes?view=summary", headers={"Authorization": f"Bearer {TOKEN.read_text().strip()}"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        summary = json.load(reply)["data"]["summary"]
    states: dict[str, int] = {}
    for node in summary:
        state = node.get("raylet", {}).get("state", "?")
        states[state] = states.get(state, 0) + 1
    return states


def smoke(address: str) -> tuple[int, str, float]:
    """Three 1-CPU tasks at once on the 0-CPU head: the autoscaler must add CPUs for them."""
    code = "import ray, time; ray.init(); f = ray.remote(num_cpus=1)(lambda: (time.sleep(5), ray.get_runtime_context().get_node_id())[1]); print(ray.get([f.remote() for _ in range(3)]))"
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": address},
        timeout=600,
    )
    print(done.stdout + done.stderr[-3000:], flush=True)
    return done.returncode, done.stdout + done.stderr, time.time() - started


def autoscaled(out: Path, idle_minutes: float, is_smoke: bool) -> dict:
    """The pipeline (or the smoke tasks) on the autoscaling cluster, then the wait for idle nodes to go."""
    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    run_dir = out / "autoscaled"
    with autoscaling_cluster(launcher, idle_minutes) as cluster:
        address = cluster["address"]
        status, log, seconds = smoke(address) if is_smoke else run_pipeline(address, run_dir)
        table = node_table(address, cluster["config"])
        labels = {n["id"]: f"{n['type']}#{i}" for i, n in enumerate(table)}
        phases = node_use(address, run_dir, labels) if status == 0 and not is_smoke else {}
        left, waited = wait_idle_gone(address, idle_minutes * 60 + 120)
        dashboard = dashboard_nodes(cluster["dashboard"])
        events = autoscaler_events(cluster["temp_dir"])
    workers = [n for n in table if n["type"] != HEAD_TYPE]
    return {
        "config": {name: t["resources"]["CPU"] for name, t in cluster["config"]["available_node_types"].items()},
        "nodes_added": events["added"],
        "nodes_removed": events["removed"],
        "job_log_autoscaler_lines": [line for line in log.splitlines() if "(autoscaler" in line][:20],
        "worker_nodes": {label: n["type"] for n in workers for label in [labels[n["id"]]]},
        "phases": phases,
        "worker_nodes_left": left,
        "idle_wait_seconds": round(waited, 1),
        "dashboard_nodes": dashboard,
        "exit_status": status,
        "seconds": round(seconds, 1),
        "run_dir": str(run_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reference", type=Path, help="a finished one-node run directory of this commit (default: run it first)"
    )
    parser.add_argument("--out", type=Path, help="where the run directories go (default: a new temporary folder)")
    parser.add_argument(
        "--idle-minutes", type=float, default=0.5, help="the autoscaler's idle timeout (cluster.yaml: 10)"
    )
    parser.add_argument("--smoke", action="store_true", help="three 1-CPU tasks instead of the pipeline, no reference")
    args = parser.parse_args(argv)
    # Token auth, as cluster.yaml's nodes run: `ray start --head` here starts its GCS in token mode, so the
    # pipeline's driver, the nodes the autoscaler starts and the bench's own reads all present the token.
    os.environ["RAY_AUTH_MODE"] = "token"
    out = args.out or Path(tempfile.mkdtemp(prefix="autoscale-"))
    # first: a cluster that does not scale fails before the reference's minutes
    result = autoscaled(out, args.idle_minutes, args.smoke)
    reference, one_node_s = (
        (args.reference, None) if args.reference or args.smoke or result["exit_status"] else one_node(out)
    )
    ok = result["exit_status"] == 0 and not args.smoke
    result = against_reference(result, reference, one_node_s, ok, "autoscale")
    print(json.dumps(result), flush=True)
    grew = bool(result["nodes_added"]) and result["worker_nodes_left"] == 0
    return 0 if grew and (args.smoke and result["exit_status"] == 0 or result["report_equal"]) else 1


if __name__ == "__main__":
    sys.exit(main())
