"""The tiny preset across several Ray nodes on one machine, its report against the one-node run's.

    python bench/multinode.py [--reference RUN_DIR | --no-reference] [--out DIR] [--kill arms|numbers] [--set K=V ...]

Starts a local cluster with `ray.cluster_utils.Cluster` (each node a raylet of its own, with its
own CPUs and object store): a head of 0 CPUs, where the driver runs (as on a cluster whose head
takes no work), and three worker nodes of 1 CPU each. The spread comes from those sizes alone,
no placement code of the bench's: on 3 CPUs each of the preset's 2 training workers asks for 1
CPU (train/ray_run.py worker_resources), so no node holds two of them and one CPU stays for Ray
Data; each Serve replica asks for 1 CPU, which the head has none of. The pipeline runs there as a
user runs it (`python jobs/pipeline.py` with RAY_ADDRESS) into a fresh run directory.

The reference is the one-node run: the same command on a cluster of one node of 2 CPUs (the
preset's machine), run first, or read from `--reference` (a finished run directory of this
commit). The reports are compared with jobs/rebuild.py's `differences`, both ways, without
`timings`, `timeline` and `provenance` (wall times, and the run's packages, host and commit).
`--no-reference` runs the several nodes alone and compares nothing (the suite's smoke test,
tests/test_many_nodes.py, on a cut-down preset); `--set` is the pipeline's, passed to every run.

`--kill arms` SIGKILLs, once the arms train (their first `[train]` report), the node holding a
training worker, its raylet and everything on it; `--kill numbers` the node holding a generating
replica once sequences come back. The cluster then has a fourth worker node, so the nodes left
still hold two training workers and a CPU for Ray Data. A run that fails after the kill is rerun
once on the nodes left, and the stages its plan runs are recorded. Not yet run against the
pipeline: the finding and killing were checked on a cluster with a stand-in actor only.

Which node did what comes from Ray's actor table (RayTrainWorker, ServeReplica:*), each actor
assigned to the phase whose recorded span (manifest.json) holds its start. The last line printed
is a JSON object: the nodes (label -> Ray node id), the driver's node, per phase the nodes of its
training workers and replicas, the node killed and the stages rerun, the seconds of each run, and
whether the reports are equal; the exit status is 0 when the run finished, the spread held
(training workers of each training phase on two nodes or more, no replica on the driver's node)
and, with a reference, the reports are equal.

The cluster's files (logs, the address file a `ray.init()` would find) live under a temporary
folder of its own (RAY_TMPDIR), and only its processes are stopped at the end (Cluster.shutdown):
never `ray stop`, which would end every Ray process on the machine. Serve is started before the
pipeline with one proxy, on the head, on a free port: the nodes share one host, where a proxy on
every node (Serve's default) would each bind the same port, and 8000 may be another cluster's.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(ROOT))  # run as `python bench/multinode.py`

from jobs.rebuild import differences  # noqa: E402

NODE_BYTES = 1 << 30  # each node's object store: the tiny run's datasets are a few MiB
ASIDE = ("timings", "timeline", "provenance")  # what may differ between equal runs: wall times, packages, host, commit
KINDS = {"RayTrainWorker": "train_workers", "ServeReplica:": "replicas"}  # actor class name prefix -> what it is


@contextlib.contextmanager
def local_cluster(head_cpus: int, workers: int):
    """A Cluster of a head of `head_cpus` CPUs and `workers` nodes of 1 CPU; yields (cluster, {label: node})."""
    from ray.cluster_utils import Cluster

    # its logs and address file, no one else's: a new folder under RAY_TMPDIR where it is set (a caller that
    # must find this cluster's processes, tests/test_many_nodes.py), else under /tmp (short: Ray's socket paths)
    os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="mn", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": head_cpus, "include_dashboard": False, "object_store_memory": NODE_BYTES},
    )
    try:
        nodes = {"head": cluster.head_node}
        for i in range(workers):
            nodes[f"worker{i + 1}"] = cluster.add_node(num_cpus=1, object_store_memory=NODE_BYTES)
        cluster.wait_for_nodes()
        start_serve(cluster.address)
        yield cluster, nodes
    finally:
        cluster.shutdown()  # its own nodes' processes only


def start_serve(address: str) -> None:
    """Serve on the cluster at `address` with its one HTTP proxy on the head, on a free port (the
    pipeline keeps a running Serve's HTTP options, docs/api.md)."""
    import socket

    import ray
    from ray import serve

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": port})
    finally:
        ray.shutdown()  # Serve's controller is detached: it stays


def run_pipeline(address: str, run_dir: Path, on_line=None, args: tuple = ()) -> tuple[int, str, float]:
    """`python jobs/pipeline.py --run-dir RUN_DIR ARGS` on the cluster at `address`: (exit status, log,
    seconds). The log is echoed as it comes, so a long run shows where it is; `on_line(line)` sees each line."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    # Each run registers its design and tracks into files of its own: both runs are a first run of the
    # design (a repeat's report says so), and neither touches results/registry.jsonl or the user's MLflow store.
    # Ray Train's state tracking asks the dashboard's API, which these clusters do not start (CPU for the run).
    env = {
        **os.environ,
        "RAY_ADDRESS": address,
        "SUBLIMINAL_REGISTRY": f"{run_dir}.registry.jsonl",
        "MLFLOW_TRACKING_URI": f"sqlite:///{run_dir}.mlflow.db",
    }
    env["RAY_TRAIN_ENABLE_STATE_TRACKING"] = "0"
    started, log = time.time(), []
    with subprocess.Popen(
        [sys.executable, "jobs/pipeline.py", "--run-dir", str(run_dir), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        for line in proc.stdout:
            log.append(line)
            print(line, end="", flush=True)
            if on_line:
                on_line(line)
    return proc.returncode, "".join(log), time.time() - started


def node_use(address: str, run_dir: Path, labels: dict[str, str]) -> dict[str, dict[str, list[str]]]:
    """{phase: {train_workers|replicas: [node labels]}} from Ray's actor table, each actor in the phase
    whose recorded span (manifest.json) holds its start."""
    import ray
    from ray._private.state import actors

    spans = json.loads((run_dir / "manifest.json").read_text()).get("spans", {})
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        table = list(actors().values())
    finally:
        ray.shutdown()
    use: dict[str, dict[str, set]] = {}
    for actor in table:
        kind = next((k for prefix, k in KINDS.items() if actor["ActorClassName"].startswith(prefix)), None)
        start = actor["StartTime"] / 1000
        phase = next(
            (p for p, s in spans.items() if p != "start" and s["started"] <= start <= s["started"] + s["seconds"]), None
        )
        if kind and phase:
            use.setdefault(phase, {}).setdefault(kind, set()).add(
                labels.get(actor["Address"]["NodeID"], actor["Address"]["NodeID"])
            )
    # in run order
    return {
        phase: {kind: sorted(nodes) for kind, nodes in sorted(use[phase].items())} for phase in spans if phase in use
    }


class Killer:
    """`--kill arms|numbers`: once the phase has started and shows progress (a training report; a
    replica's generated sequences), the node holding a training worker (a generating replica), found
    in Ray's actor table, is SIGKILLed with everything on it (`Cluster.remove_node(allow_graceful=False)`)."""

    HELD = {"arms": "RayTrainWorker", "numbers": "ServeReplica:"}

    def __init__(self, phase: str, cluster, nodes: dict):
        self.phase, self.cluster, self.nodes = phase, cluster, nodes
        self.started, self.since, self.killed = False, 0.0, None

    def progress(self, line: str) -> bool:
        # a training worker's line comes prefixed by Ray: "(RayTrainWorker pid=...) [train] ..."
        if self.phase == "arms":
            return "[train] " in line
        return line.startswith("[numbers] ") and " generated, " in line

    def __call__(self, line: str) -> None:
        if self.killed:
            return
        if line.startswith(f"[{self.phase}] starting"):
            self.started, self.since = True, time.time()
        elif self.started and self.progress(line):
            self.kill()

    def kill(self) -> None:
        """The first worker node holding what the phase runs on, killed; none up yet: the next progress line tries again."""
        import ray
        from ray._private.state import actors

        ray.init(address=self.cluster.address, logging_level="ERROR", log_to_driver=False)
        try:
            holders = [
                a["Address"]["NodeID"]
                for a in actors(actor_state_name="ALIVE").values()
                if a["ActorClassName"].startswith(self.HELD[self.phase])
            ]
        finally:
            ray.shutdown()
        workers = {node.node_id: label for label, node in self.nodes.items() if label != "head"}
        held = [workers[node] for node in holders if node in workers]
        if not held:
            return
        label = held[0]
        self.cluster.remove_node(self.nodes[label], allow_graceful=False)
        self.killed = {
            "node": label,
            "id": self.nodes[label].node_id,
            "held": self.HELD[self.phase],
            "seconds_into_phase": round(time.time() - self.since, 1),
        }
        print(
            f"[multinode] killed {label} ({self.nodes[label].node_id}): it held a {self.HELD[self.phase]} in the {self.phase} phase",
            flush=True,
        )


def planned_runs(log: str) -> list[str]:
    """The stages a run's `[plan]` lines say it runs (`  <stage>  run  <why>`)."""
    return re.findall(r"^  (\S+) +run  ", log, re.M)


def comparable(run_dir: Path) -> dict:
    report = json.loads((run_dir / "report.json").read_text())
    return {key: value for key, value in report.items() if key not in ASIDE}


def one_node(out: Path, args: tuple = ()) -> tuple[Path, float]:
    """The reference: the pipeline on one node of 2 CPUs."""
    run_dir = out / "one-node"
    with local_cluster(head_cpus=2, workers=0) as (cluster, _):
        status, log, seconds = run_pipeline(cluster.address, run_dir, args=("--fresh", *args))
    if status != 0:
        sys.exit(f"the one-node run failed (exit status {status}); its log is above")
    return run_dir, seconds


def multi_node(out: Path, kill: str | None, args: tuple = ()) -> dict:
    """The pipeline on the head and worker nodes (one spare with --kill, so the nodes left still hold
    two training workers and a CPU for Ray Data); a run that fails after the kill is rerun once on the
    nodes left, and the stages its plan runs are recorded."""
    run_dir = out / "multi-node"
    with local_cluster(head_cpus=0, workers=4 if kill else 3) as (cluster, nodes):
        labels = {node.node_id: label for label, node in nodes.items()}
        killer = Killer(kill, cluster, nodes) if kill else None
        # --fresh: a run directory left in --out by an earlier bench would otherwise be reused whole
        status, log, seconds = run_pipeline(cluster.address, run_dir, killer, ("--fresh", *args))
        first_status, rerun = status, []
        if status != 0 and killer and killer.killed:
            status, log, more = run_pipeline(cluster.address, run_dir, args=args)
            rerun, seconds = planned_runs(log), seconds + more
        phases = node_use(cluster.address, run_dir, labels) if status == 0 else {}
    return {
        "nodes": {label: node.node_id for label, node in nodes.items()},
        "driver_node": "head",
        "phases": phases,
        "train_workers_spread": all(len(p["train_workers"]) >= 2 for p in phases.values() if "train_workers" in p)
        and bool(phases),
        "replicas_off_driver_node": all("head" not in p["replicas"] for p in phases.values() if "replicas" in p)
        and bool(phases),
        "killed": killer.killed if killer else None,
        "first_exit_status": first_status,
        "stages_rerun": rerun,
        "exit_status": status,
        "seconds": round(seconds, 1),
        "run_dir": str(run_dir),
    }


def against_reference(result: dict, reference: Path, one_node_s: float | None, ok: bool, tag: str) -> dict:
    """`result` with its run's report compared against the one-node run's in `reference` (`comparable`:
    ASIDE left out; jobs/rebuild.py's `differences`, both ways), each difference printed under `[tag]`;
    a run that did not finish (`ok` false) compares nothing and is not equal."""
    ours, theirs = (comparable(Path(result["run_dir"])), comparable(reference)) if ok else ({}, {})
    found = differences(theirs, ours) + differences(ours, theirs)
    for line in found[:20]:
        print(f"[{tag}] differs: {line}", flush=True)
    return result | {
        "one_node_seconds": one_node_s and round(one_node_s, 1),
        "reference": str(reference),
        "report_equal": ok and not found,
        "differences": len(found),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    reference = parser.add_mutually_exclusive_group()
    reference.add_argument(
        "--reference", type=Path, help="a finished one-node run directory of this commit (default: run it first)"
    )
    reference.add_argument("--no-reference", action="store_true", help="no one-node run, no comparison")
    parser.add_argument("--out", type=Path, help="where the run directories go (default: a new temporary folder)")
    what = "SIGKILL the node holding a training worker (arms) or a generating replica (numbers) mid-phase"
    parser.add_argument("--kill", choices=sorted(Killer.HELD), help=what)
    parser.add_argument("--set", action="append", default=[], metavar="K=V", help="the pipeline's, for every run")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="multinode-"))
    extra = tuple(arg for pair in args.set for arg in ("--set", pair))
    if args.no_reference:
        reference, one_node_s = None, None
    else:
        reference, one_node_s = (args.reference, None) if args.reference else one_node(out, extra)
    result = multi_node(out, args.kill, extra)
    if reference:
        result = against_reference(result, reference, one_node_s, result["exit_status"] == 0, "multinode")
    print(json.dumps(result), flush=True)
    held = result["exit_status"] == 0 and result["train_workers_spread"] and result["replicas_off_driver_node"]
    return 0 if held and (reference is None or result["report_equal"]) else 1


if __name__ == "__main__":
    sys.exit(main())
