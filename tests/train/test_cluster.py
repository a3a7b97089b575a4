"""The capacity reading on an autoscaling cluster: the node types come from the config the cluster's
autoscaler runs with (found from its monitor process), and the training workers' requests are sized
to what the cluster can grow to, not to the head alone. No Ray is started: the monitor processes
are command lines in a stand-in /proc."""

from pathlib import Path

import yaml

from train.cluster import BOOTSTRAP_CONFIG, autoscaler_config_path, capacity, launcher_nodes, load_launcher_config
from train.config import TrainConfig
from train.ray_run import worker_resources

ROOT = Path(__file__).resolve().parents[2]
V1 = "/venv/lib/python3.11/site-packages/ray/autoscaler/_private/monitor.py"
V2 = "/venv/lib/python3.11/site-packages/ray/autoscaler/v2/monitor.py"

# A local fake_multinode cluster with cluster.yaml's worker types as CPU stand-ins (bench/autoscale.py).
STAND_IN = {
    "cluster_name": "subliminal-stand-in",
    "max_workers": 4,
    "idle_timeout_minutes": 0.5,
    "provider": {"type": "fake_multinode", "gcs_address": "10.0.0.5:41234"},
    "head_node_type": "ray.head.default",
    "available_node_types": {
        "ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0},
        "gpu-8x-h100": {"resources": {"CPU": 8}, "node_config": {}, "min_workers": 0, "max_workers": 2},
        "gpu-1x-l40s": {"resources": {"CPU": 1}, "node_config": {}, "min_workers": 0, "max_workers": 2},
    },
}


def processes(root: Path, *commands: list[str]) -> Path:
    """A stand-in /proc: one numbered folder per command, its NUL-separated cmdline."""
    for pid, command in enumerate(commands, start=100):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in command) + b"\0")
    (root / "self").mkdir()  # not a pid: skipped
    return root


def monitor(entry: str, gcs: str, config: Path | None) -> list[str]:
    """The command line Ray's `start_monitor` gives the autoscaler (ray/_private/services.py)."""
    args = ["/venv/bin/python", "-u", entry, "--logs-dir=/tmp/ray/session_x/logs", f"--gcs-address={gcs}"]
    return args + ([f"--autoscaling-config={config}"] if config else []) + ["--monitor-ip=10.0.0.5"]


def test_the_config_is_the_one_the_clusters_autoscaler_runs_with(tmp_path):
    ours, theirs = tmp_path / "ours.yaml", tmp_path / "theirs.yaml"
    ours.write_text(yaml.safe_dump(STAND_IN))
    theirs.write_text(yaml.safe_dump({**STAND_IN, "max_workers": 1}))
    proc = processes(
        tmp_path / "proc",
        monitor(V1, "10.0.0.5:6379", theirs),  # another cluster on this machine, on Ray's default port
        [
            "/venv/bin/python",
            "/venv/bin/ray",
            "start",
            "--head",
            "--port=41234",
            f"--autoscaling-config={ours}",
        ],  # not the monitor
        monitor(V2, "10.0.0.5:41234", ours),
        monitor(V1, "10.0.0.5:50000", None),  # a cluster whose autoscaler has no config (a fixed cluster)
    )
    # The driver names the GCS by loopback, the monitor by the node's address: the port decides.
    assert autoscaler_config_path("127.0.0.1:41234", proc) == ours
    assert autoscaler_config_path("10.0.0.5:6379", proc) == theirs
    assert autoscaler_config_path("127.0.0.1:50000", proc) is None
    assert autoscaler_config_path("127.0.0.1:1", proc) is None and autoscaler_config_path(None, proc) is None
    assert autoscaler_config_path("auto", proc) is None
    assert load_launcher_config("127.0.0.1:41234", proc) == STAND_IN


def test_without_a_monitor_here_the_ray_up_bootstrap_config_is_read(tmp_path, monkeypatch):
    proc = processes(tmp_path / "proc", ["/bin/sh"])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    expected = yaml.safe_load(BOOTSTRAP_CONFIG.read_text()) if BOOTSTRAP_CONFIG.is_file() else None
    assert load_launcher_config("127.0.0.1:41234", proc) == expected
    monkeypatch.setattr("train.cluster.BOOTSTRAP_CONFIG", tmp_path / "absent.yaml")
    assert load_launcher_config("127.0.0.1:41234", proc) is None


def test_capacity_counts_the_nodes_the_autoscaler_can_add():
    head = {"NodeID": "h", "Alive": True, "Resources": {"CPU": 0.0, "memory": 1e9}}
    cap = capacity([head], 0.0, STAND_IN)
    # The head alone now; at most two 8-CPU and two 1-CPU stand-ins (max_workers 4 in all).
    assert launcher_nodes(STAND_IN, "CPU") == [0.0, 8.0, 8.0, 1.0, 1.0]
    assert (cap.cpus, cap.cpus_at_most, cap.autoscaler, cap.max_gpus) == (0.0, 18.0, True, 0.0)
    # The global bound cuts the richest types first: one worker node in all is one 8-CPU node.
    assert capacity([head], 0.0, {**STAND_IN, "max_workers": 1}).cpus_at_most == 8.0
    # cluster.yaml itself: the 16-CPU head and 2 x 192 + 2 x 16 CPUs; its GPU bound as before.
    launcher = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    real = capacity([head], 16.0, launcher)
    assert (real.cpus_at_most, real.max_gpus, real.max_gpus_per_node) == (16 + 2 * 192 + 2 * 16, 18.0, 8.0)


def test_worker_requests_are_what_the_preset_needs_not_what_is_up_now():
    """The tiny preset's 2 training workers ask 1 CPU each on the autoscaling cluster whose head has
    none (so the autoscaler must add nodes for them), as on a fixed 3-CPU cluster; on a fixed 2-CPU
    machine half a CPU each, leaving one to Ray Data, as before."""
    head = {"NodeID": "h", "Alive": True, "Resources": {"CPU": 0.0}}
    tiny = TrainConfig(num_workers=2)
    assert worker_resources(tiny, capacity([head], 0.0, STAND_IN)) == {"CPU": 1.0}
    assert worker_resources(tiny, capacity([head], 0.0, None)) == {"CPU": 0.1}  # no autoscaler: what is there
    assert worker_resources(tiny, capacity([head], 2.0, None)) == {"CPU": 0.5}
    assert worker_resources(tiny, capacity([head], 3.0, None)) == {"CPU": 1.0}
