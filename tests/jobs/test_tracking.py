"""MLflow tracking (jobs/tracking.py) against real stores: the embedded SQLite file and a real
`mlflow server` on localhost. The run directory is one the pipeline would leave after training
the teacher and reporting: its manifest, the adapter's train_metrics.json and a report. (The
end-to-end pipeline test reads a whole tiny run back from the store.)"""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import requests

from jobs.experiment.config import load_experiment
from jobs.rundir.manifest import Manifest
from jobs.tracking import Tracker, TrackingError

LOSSES = [[1, 2.5], [2, 2.0], [3, 1.25]]
REPORT = {
    "models": {"teacher": {"accuracy_by_split": {"train": 0.8, "held_out": 0.7}}},
    "arms": {},
    "contrasts": {},
    "accuracy_by_order": {"models": {"teacher": {"held_out": {"as_written": 0.7, "over_orders": 0.65}}}},
}


@pytest.fixture(autouse=True)
def no_mlflow_variables(monkeypatch):
    """mlflow.set_tracking_uri (tracked() below, and other tests of the session) sets MLFLOW_TRACKING_URI
    in this process, which Tracker.for_run reads: each test starts without it."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)


def teacher_run(run_dir: Path, lr: float = 2.0e-3) -> Manifest:
    """A run directory holding a trained teacher and a report, as the pipeline writes them."""
    (run_dir / "teacher" / "adapter").mkdir(parents=True)
    metrics = {"loss_history": LOSSES, "tokens_per_s": 1234.5, "train_config": {"lr": lr, "lora_rank": 8}}
    (run_dir / "teacher" / "adapter" / "train_metrics.json").write_text(json.dumps(metrics))
    (run_dir / "report.json").write_text(json.dumps(REPORT))
    (run_dir / "report.md").write_text("# report\n")
    manifest = Manifest(run_dir)
    manifest.record("teacher", {"teacher.lr": lr}, 1.0, {"hash": "t"})
    manifest.record("report", {"evaluate.primary_metric": "agreement"}, 1.0, {"hash": "r"})
    return manifest


def tracked(tracker: Tracker, run_dir: Path) -> tuple[list, list]:
    mlflow.set_tracking_uri(tracker.uri)
    runs = mlflow.search_runs(experiment_names=[tracker.experiment], filter_string=f"tags.run_dir = '{run_dir}'", output_format="list")
    children = mlflow.search_runs(experiment_names=[tracker.experiment], filter_string="tags.`subliminal.kind` = 'model'", output_format="list")
    return runs, [c for c in children if c.data.tags["mlflow.parentRunId"] in {r.info.run_id for r in runs}]


def check_sync(tracker: Tracker, run_dir: Path, manifest: Manifest) -> None:
    cfg = load_experiment("tiny")
    tracker.check()
    tracker.sync(cfg, manifest, {})
    tracker.sync(cfg, manifest, {})  # again: nothing new, nothing twice
    (parent,), (child,) = tracked(tracker, run_dir)
    assert child.data.tags["stage"] == "teacher" and child.data.params == {"lr": "0.002", "lora_rank": "8"}
    assert child.info.end_time - child.info.start_time == 1000  # dated when the stage ran (1 s), not when written
    history = mlflow.MlflowClient(tracker.uri).get_metric_history(child.info.run_id, "loss")
    assert [[m.step, m.value] for m in history] == LOSSES
    assert child.data.metrics["tokens_per_s"] == 1234.5 and child.data.metrics["accuracy.held_out"] == 0.7
    assert [a.path for a in mlflow.MlflowClient(tracker.uri).list_artifacts(child.info.run_id)] == ["train_metrics.json"]
    assert parent.data.tags["mlflow.source.name"] == "jobs/pipeline.py" and parent.data.tags["mlflow.user"]
    assert parent.data.tags["mlflow.source.git.commit"] == parent.data.tags["git_commit"]
    assert parent.data.metrics["accuracy.teacher.held_out.over_orders"] == 0.65
    assert {a.path for a in mlflow.MlflowClient(tracker.uri).list_artifacts(parent.info.run_id)} == {"report.md", "report.json"}
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
    assert sorted(p.name for p in (tmp_path / "team" / "mlflow-artifacts").rglob("report.*")) == ["report.json", "report.md"]
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
    assert (Tracker.for_run(preset, tmp_path / "cache", run_dir).uri, Tracker.for_run(preset, tmp_path / "cache", run_dir).experiment) == (
        f"sqlite:///{tmp_path}/own.db",
        "mine",
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """A real tracking server on localhost, its own SQLite store and artifact folder."""
    port = free_port()
    args = ["--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"]
    args += ["--artifacts-destination", str(tmp_path / "server-artifacts")]
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
def test_a_remote_tracking_server_gets_the_same_runs_and_a_dead_one_never_stops_the_run(tmp_path, mlflow_server, capsys):
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
    assert done.returncode == 2 and f"error: tracking.uri {uri}: cannot reach the MLflow server" in done.stderr, done.stderr[-2000:]
    assert "tracking=off" in done.stderr
    assert not (run_dir / "manifest.json").exists() and "[placement]" not in done.stdout  # before Ray, before any stage
