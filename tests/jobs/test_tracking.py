"""MLflow tracking (jobs/tracking.py, tracking_store.py) against real stores: the embedded SQLite
file and a real `mlflow server` on localhost. The run directory is one the pipeline would leave
after training the teacher and reporting: its manifest, the adapter's train_metrics.json and a
report. (The end-to-end pipeline test reads a whole tiny run back from the store.)"""

import json
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import requests
from conftest import free_port

from jobs.experiment.config import load_experiment
from jobs.reporting.schema import Report
from jobs.rundir.manifest import Manifest
from jobs.tracking import Tracker
from jobs.tracking_store import TrackingError

LOSSES = [[1, 2.5], [2, 2.0], [3, 1.25]]
# step, time, lr, grad norm
STEPS = [[1, 1_700_000_000.25, 1e-3, 4.5], [2, 1_700_000_001.5, 2e-3, 3.0], [3, 1_700_000_002.75, 2e-3, 1.5]]
ROOT = Path(__file__).resolve().parents[2]
# a real report, as the pipeline writes it
REPORT = Report.load(sorted((ROOT / "results" / "tiny").glob("*/report.json"))[-1])


@pytest.fixture(autouse=True)
def no_mlflow_variables(monkeypatch):
    """mlflow.set_tracking_uri (tracked() below, and other tests of the session) sets MLFLOW_TRACKING_URI
    in this process, which Tracker.for_run reads: each test starts without it."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)


def teacher_run(run_dir: Path, lr: float = 2.0e-3) -> Manifest:
    """A run directory holding a trained teacher and a report, as the pipeline writes them."""
    (run_dir / "teacher" / "adapter").mkdir(parents=True)
    metrics = {
        "loss_history": LOSSES,
        "step_history": STEPS,
        "tokens_per_s": 1234.5,
        "train_config": {"lr": lr, "lora_rank": 8},
    }
    (run_dir / "teacher" / "adapter" / "train_metrics.json").write_text(json.dumps(metrics))
    (run_dir / "report.json").write_text(json.dumps(REPORT.dump()))
    (run_dir / "report.md").write_text("# report\n")
    manifest = Manifest(run_dir)
    manifest.record("teacher", {"teacher.lr": lr}, 1.0, {"hash": "t"})
    manifest.record("report", {"evaluate.primary_metric": "agreement"}, 1.0, {"hash": "r"})
    return manifest


def tracked(tracker: Tracker, run_dir: Path) -> tuple[list, list]:
    mlflow.set_tracking_uri(tracker.uri)
    runs = mlflow.search_runs(
        experiment_names=[tracker.experiment], filter_string=f"tags.run_dir = '{run_dir}'", output_format="list"
    )
    children = mlflow.search_runs(
        experiment_names=[tracker.experiment], filter_string="tags.`subliminal.kind` = 'model'", output_format="list"
    )
    return runs, [c for c in children if c.data.tags["mlflow.parentRunId"] in {r.info.run_id for r in runs}]


def check_sync(tracker: Tracker, run_dir: Path, manifest: Manifest) -> None:
    cfg = load_experiment("tiny")
    # the report's pictures go to the parent with it (this one stands for them)
    (run_dir / "timeline.png").write_bytes(b"\x89PNG")
    tracker.check()
    tracker.sync(cfg, manifest, {})
    tracker.sync(cfg, manifest, {})  # again: nothing new, nothing twice
    (parent,), (child,) = tracked(tracker, run_dir)
    assert child.data.tags["stage"] == "teacher" and child.data.params == {"lr": "0.002", "lora_rank": "8"}
    assert child.info.end_time - child.info.start_time == 1000  # dated when the stage ran (1 s), not when written
    client = mlflow.MlflowClient(tracker.uri)
    history = client.get_metric_history(child.info.run_id, "loss")
    assert [[m.step, m.value] for m in history] == LOSSES
    assert [m.timestamp for m in history] == [int(at * 1000) for _, at, _, _ in STEPS]  # each step at the time it ended
    for name, column in (("lr", 2), ("grad_norm", 3)):
        assert [[m.step, m.value] for m in client.get_metric_history(child.info.run_id, name)] == [
            [row[0], row[column]] for row in STEPS
        ]
    assert child.data.metrics["tokens_per_s"] == 1234.5
    assert child.data.metrics["accuracy.held_out"] == REPORT.models["teacher"].accuracy_by_split["held_out"]
    assert [a.path for a in mlflow.MlflowClient(tracker.uri).list_artifacts(child.info.run_id)] == [
        "train_metrics.json"
    ]
    assert parent.data.tags["mlflow.source.name"] == "jobs/pipeline.py" and parent.data.tags["mlflow.user"]
    assert parent.data.tags["mlflow.source.git.commit"] == parent.data.tags["git_commit"]
    assert (
        parent.data.metrics["accuracy.teacher.held_out.over_orders"]
        == REPORT.accuracy_by_order.models["teacher"]["held_out"].over_orders
    )
    assert parent.data.metrics["verdict.student.effect"] == REPORT.arms["student"].transfer.primary.value
    assert (
        parent.data.tags["verdict.student"] == REPORT.arms["student"].verdict
        and parent.data.tags["registration"] == REPORT.provenance.registration.status
    )
    assert {a.path for a in mlflow.MlflowClient(tracker.uri).list_artifacts(parent.info.run_id)} == {
        "report.md",
        "report.json",
        "timeline.png",
        "config.json",
    }
    assert parent.data.params["teacher.lr"] == str(cfg.teacher.lr) and parent.data.params["replicates"] == str(
        cfg.replicates
    )
    assert (
        json.loads(
            Path(
                mlflow.artifacts.download_artifacts(
                    run_id=parent.info.run_id, artifact_path="config.json", tracking_uri=tracker.uri
                )
            ).read_text()
        )["name"]
        == "tiny"
    )
    assert parent.info.status == "RUNNING"
    tracker.finish("FAILED")  # the pipeline ended on an error: the UI says so, not RUNNING
    assert tracked(tracker, run_dir)[0][0].info.status == "FAILED"
    tracker.sync(cfg, manifest, {})  # a rerun of the run directory runs its parent again
    assert tracked(tracker, run_dir)[0][0].info.status == "RUNNING"


def test_the_embedded_store_holds_a_parent_and_a_child_per_model_once(tmp_path):
    run_dir = tmp_path / "run"
    manifest = teacher_run(run_dir)
    tracker = Tracker.for_run(load_experiment("tiny"), tmp_path / "cache", run_dir, "tiny.yaml")
    assert tracker.uri == f"sqlite:///{tmp_path / 'cache' / 'mlflow.db'}"
    check_sync(tracker, run_dir, manifest)
    # The teacher retrained under another setting is another model: a second child; the first stays.
    manifest.record("teacher", {"teacher.lr": 1.0e-3}, 1.0, {"hash": "t2"})
    tracker.sync(load_experiment("tiny"), manifest, {})
    assert len(tracked(tracker, run_dir)[1]) == 2
    assert Tracker.for_run(load_experiment("tiny", ["tracking=off"]), tmp_path, run_dir) is None


def test_a_rerun_with_another_config_starts_a_parent_that_names_the_one_it_supersedes(tmp_path):
    run_dir = tmp_path / "run"
    manifest = teacher_run(run_dir)
    first_cfg, second_cfg = load_experiment("tiny"), load_experiment("tiny", ["evaluate.primary_metric=agreement"])
    Tracker.for_run(first_cfg, tmp_path / "cache", run_dir, "tiny.yaml").sync(first_cfg, manifest, {})
    (first,), _ = tracked(Tracker.for_run(first_cfg, tmp_path / "cache", run_dir), run_dir)
    second_tracker = Tracker.for_run(second_cfg, tmp_path / "cache", run_dir, "tiny.yaml")
    second_tracker.sync(second_cfg, manifest, {})
    (current,), (child,) = tracked(second_tracker, run_dir)  # one current parent; the reused teacher logged under it
    assert current.data.tags["supersedes"] == first.info.run_id and child.data.tags["stage"] == "teacher"
    assert current.data.params["evaluate.primary_metric"] == "agreement"
    earlier = mlflow.MlflowClient(second_tracker.uri).get_run(first.info.run_id)
    assert earlier.data.params["evaluate.primary_metric"] == "teacher_answer_rank"  # what its runs were made with, kept
    assert earlier.data.tags["run_dir"].startswith(
        f"{run_dir} (superseded by config {second_tracker.config_digest} at "
    )
    second_tracker.sync(second_cfg, manifest, {})  # the same config again: the same parent
    assert [r.info.run_id for r in tracked(second_tracker, run_dir)[0]] == [current.info.run_id]


def test_a_sqlite_uri_of_the_users_keeps_its_artifacts_beside_its_file(tmp_path, monkeypatch):
    """Not in ./mlruns of the working directory (MLflow's default), which a Ray job's upload loses."""
    run_dir, workdir = tmp_path / "run", tmp_path / "workdir"
    manifest = teacher_run(run_dir)
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    cfg = load_experiment("tiny", [f"tracking.uri=sqlite:///{tmp_path}/team/store.db"])
    (tmp_path / "team").mkdir()
    tracker = Tracker.for_run(cfg, tmp_path / "cache", run_dir, "tiny.yaml")
    tracker.sync(cfg, manifest, {})
    assert sorted(p.name for p in (tmp_path / "team" / "mlflow-artifacts").rglob("report.*")) == [
        "report.json",
        "report.md",
    ]
    assert list(workdir.iterdir()) == []


def test_mlflows_own_variables_choose_the_store_and_experiment_a_preset_leaves_open(tmp_path, monkeypatch):
    """MLFLOW_TRACKING_URI and MLFLOW_EXPERIMENT_NAME are read as other trainers read them, after the
    preset's own tracking.uri and tracking.experiment."""
    run_dir = tmp_path / "run"
    manifest = teacher_run(run_dir)
    (tmp_path / "team").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/team/store.db")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "team-wmdp")
    cfg = load_experiment("tiny")
    tracker = Tracker.for_run(cfg, tmp_path / "cache", run_dir, "tiny.yaml")
    tracker.sync(cfg, manifest, {})
    experiment = mlflow.MlflowClient(f"sqlite:///{tmp_path}/team/store.db").get_experiment_by_name("team-wmdp")
    assert experiment is not None and not (tmp_path / "cache" / "mlflow.db").exists()
    preset = load_experiment("tiny", [f"tracking.uri=sqlite:///{tmp_path}/own.db", "tracking.experiment=mine"])
    assert (
        Tracker.for_run(preset, tmp_path / "cache", run_dir).uri,
        Tracker.for_run(preset, tmp_path / "cache", run_dir).experiment,
    ) == (
        f"sqlite:///{tmp_path}/own.db",
        "mine",
    )


@pytest.fixture
def mlflow_server(tmp_path):
    """A real tracking server on localhost, its own SQLite store and artifact folder."""
    port = free_port()
    args = [
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--backend-store-uri",
        f"sqlite:///{tmp_path / 'server.db'}",
    ]
    args += ["--artifacts-destination", str(tmp_path / "server-artifacts")]
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if requests.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                time.sleep(0.5)
        else:
            pytest.fail("mlflow server did not start in 60 s")
        yield uri, server
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_a_remote_tracking_server_gets_the_same_runs_and_a_dead_one_never_stops_the_run(
    tmp_path, mlflow_server, capsys
):
    uri, server = mlflow_server
    run_dir = tmp_path / "run"
    manifest = teacher_run(run_dir)
    cfg = load_experiment("tiny", [f"tracking.uri={uri}", "tracking.experiment=remote"])
    tracker = Tracker.for_run(cfg, tmp_path / "cache", run_dir, "tiny.yaml")
    check_sync(tracker, run_dir, manifest)
    assert not (tmp_path / "cache").exists()  # nothing went to the embedded store

    server.terminate()
    server.wait(timeout=30)
    manifest.record("teacher", {"teacher.lr": 1.0e-3}, 1.0, {"hash": "t2"})
    tracker.sync(cfg, manifest, {})  # the server died mid-run: printed, not raised
    assert f"[tracking] not written to {uri}" in capsys.readouterr().out
    with pytest.raises(TrackingError, match=f"tracking.uri {uri}: cannot reach the MLflow server"):
        tracker.check()


def test_an_unreachable_tracking_server_stops_the_pipeline_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env_cache = ["--set", f"cache_dir={tmp_path / 'cache'}"]
    done = subprocess.run(
        [sys.executable, "jobs/pipeline.py", "--run-dir", str(run_dir), "--set", f"tracking.uri={uri}", *env_cache],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and f"error: tracking.uri {uri}: cannot reach the MLflow server" in done.stderr, (
        done.stderr[-2000:]
    )
    assert "tracking=off" in done.stderr
    assert not (run_dir / "manifest.json").exists() and "[placement]" not in done.stdout  # before Ray, before any stage


MOUNTS = """/dev/nvme0n1p1 / ext4 rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
fs-0123.efs.us-west-2.amazonaws.com:/ /mnt/shared nfs4 rw,vers=4.1 0 0
/dev/nvme1n1 /mnt/shared/local\\040disk ext4 rw 0 0
"""


def test_a_network_file_system_is_told_from_a_local_disk():
    from jobs.tracking_store import network_filesystem

    assert network_filesystem(Path("/mnt/shared/cache"), MOUNTS) == "nfs4 at /mnt/shared"
    assert network_filesystem(Path("/mnt/shared"), MOUNTS) == "nfs4 at /mnt/shared"
    assert network_filesystem(Path("/mnt/shared/local disk/mlflow"), MOUNTS) is None  # a local disk mounted inside it
    assert (
        network_filesystem(Path("/mnt/sharedother"), MOUNTS) is None
        and network_filesystem(Path("/tmp/x"), MOUNTS) is None
    )


def test_a_sqlite_store_on_a_network_file_system_is_refused_before_any_work(tmp_path, monkeypatch):
    """SQLite's locks are unreliable over NFS: the run stops naming the store and what to do instead."""
    import jobs.tracking_store

    monkeypatch.setattr(
        jobs.tracking_store,
        "network_filesystem",
        lambda folder: "nfs4 at /mnt/shared" if folder == tmp_path / "shared" else None,
    )
    cfg = load_experiment("tiny", [f"tracking.uri=sqlite:///{tmp_path}/shared/mlflow.db"])
    with pytest.raises(
        TrackingError, match=r"a SQLite file on a network file system \(nfs4 at /mnt/shared\).*local disk.*tracking=off"
    ):
        Tracker.for_run(cfg, tmp_path, tmp_path / "run").check()
    assert not (tmp_path / "shared" / "mlflow.db").exists()
    Tracker.for_run(
        load_experiment("tiny", [f"tracking.uri=sqlite:///{tmp_path}/local/mlflow.db"]), tmp_path, tmp_path / "run"
    ).check()
