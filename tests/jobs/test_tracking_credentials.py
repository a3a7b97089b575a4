"""A tracking URI's credentials are in no log line, MLflow param, config.json or report provenance
(jobs/experiment/credentials.py), and a tracking token reaches the job from a file, as the hub
token does. The token's absence from Ray's records is tests/test_hub_token.py's."""

import json
import re
from pathlib import Path

import mlflow
import pytest
from test_tracking import free_port, mlflow_server, teacher_run  # noqa: F401 - the real server and run directory (pytest puts tests/jobs on the path)

from jobs.experiment.config import as_dict, load_experiment
from jobs.experiment.credentials import TOKEN_PATH, read_tracking_token, redacted_uri, without_user_info
from jobs.tracking import Tracker
from jobs.tracking_store import TrackingError
from train.config import ConfigError

SECRET = "s3cret-Pa55"


@pytest.fixture(autouse=True)
def no_mlflow_variables(monkeypatch):
    for name in (
        "MLFLOW_TRACKING_URI",
        "MLFLOW_EXPERIMENT_NAME",
        "MLFLOW_TRACKING_TOKEN",
        TOKEN_PATH,
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",
    ):
        monkeypatch.setenv(name, "")  # recorded, so what a test (or the Tracker) sets is undone after it
        monkeypatch.delenv(name)


@pytest.mark.parametrize(
    "uri, shown",
    [
        (f"https://alice:{SECRET}@mlflow.example.com:5000/", "https://***@mlflow.example.com:5000/"),
        (f"postgresql://alice:{SECRET}@db.internal:5432/mlflow", "postgresql://***@db.internal:5432/mlflow"),
        (
            f"mysql+pymysql://alice:p@{SECRET}@db/mlflow",
            "mysql+pymysql://***@db/mlflow",
        ),  # an unescaped @ in the password
        (f"https://{SECRET}@mlflow.example.com", "https://***@mlflow.example.com"),  # a token as the user
        (f"https://h/?experiment=1&access_token={SECRET}&x=2", "https://h/?experiment=1&access_token=***&x=2"),
        ("http://mlflow.internal:5000", "http://mlflow.internal:5000"),
        ("sqlite:////home/u/.cache/subliminal-ray/mlflow.db", "sqlite:////home/u/.cache/subliminal-ray/mlflow.db"),
        ("https://h/runs/a@b", "https://h/runs/a@b"),  # an @ in the path is not user info
    ],
)
def test_a_uris_credentials_are_redacted_and_nothing_else(uri, shown):
    assert redacted_uri(uri) == shown
    assert SECRET not in without_user_info(uri).split("?")[0]


def test_the_config_every_record_is_made_from_holds_no_credential():
    """as_dict is what config.json, the parent run's params and the report's provenance hold."""
    cfg = load_experiment("tiny", [f"tracking.uri=postgresql://alice:{SECRET}@db.internal/mlflow"])
    # the run itself still connects with it
    assert cfg.tracking.uri.endswith("@db.internal/mlflow") and SECRET in cfg.tracking.uri
    assert as_dict(cfg)["tracking"]["uri"] == "postgresql://***@db.internal/mlflow"
    assert SECRET not in json.dumps(as_dict(cfg))


def test_an_unreachable_server_is_named_without_its_password(tmp_path, capsys):
    uri = f"http://alice:{SECRET}@127.0.0.1:{free_port()}"  # nothing listens there
    cfg = load_experiment("tiny", [f"tracking.uri={uri}"])
    tracker = Tracker.for_run(cfg, tmp_path / "cache", tmp_path / "run", "tiny.yaml")
    with pytest.raises(TrackingError) as caught:
        tracker.check()
    assert f"tracking.uri http://***@127.0.0.1:{uri.rsplit(':', 1)[1]}: cannot reach the MLflow server" in str(
        caught.value
    )
    assert SECRET not in str(caught.value)
    tracker.sync(cfg, teacher_run(tmp_path / "run"), {})  # printed, never raised
    out = capsys.readouterr().out
    assert "[tracking] not written to http://***@127.0.0.1" in out and SECRET not in out


def test_a_token_comes_from_its_file_into_the_process_alone(tmp_path, monkeypatch):
    token = tmp_path / "mlflow_token"
    token.write_text(f"{SECRET}\n")
    environ = {TOKEN_PATH: str(token)}
    read_tracking_token(environ)
    assert environ["MLFLOW_TRACKING_TOKEN"] == SECRET
    # one already set wins: no error, no change
    read_tracking_token({TOKEN_PATH: str(token), "MLFLOW_TRACKING_TOKEN": "set"})
    with pytest.raises(
        ConfigError, match=re.escape(f"{TOKEN_PATH}={tmp_path / 'missing'}: cannot read the tracking token")
    ):
        read_tracking_token({TOKEN_PATH: str(tmp_path / "missing")})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="the file is empty"):
        read_tracking_token({TOKEN_PATH: str(tmp_path / "empty")})
    monkeypatch.setenv(TOKEN_PATH, str(token))  # the pipeline's way in: Tracker.for_run reads it before the check
    Tracker.for_run(load_experiment("tiny"), tmp_path / "cache", tmp_path / "run", "tiny.yaml")
    from mlflow.utils.credentials import get_default_host_creds

    assert get_default_host_creds("http://127.0.0.1:5000").token == SECRET  # what MLflow's client sends


@pytest.mark.slow
def test_a_server_reached_with_credentials_holds_none_of_them(tmp_path, mlflow_server, capsys, monkeypatch):  # noqa: F811
    """A real `mlflow server` (which ignores the basic-auth header) reached through a URI with a user
    and password: the runs are written, and neither the params, nor config.json, nor the log holds
    the password (MLflow's own "View run" lines included)."""
    uri, _ = mlflow_server
    secret_uri = uri.replace("http://", f"http://alice:{SECRET}@")
    run_dir = tmp_path / "run"
    manifest = teacher_run(run_dir)
    cfg = load_experiment("tiny", [f"tracking.uri={secret_uri}", "tracking.experiment=credentials"])
    tracker = Tracker.for_run(cfg, tmp_path / "cache", run_dir, "tiny.yaml")
    tracker.check()  # the /health check goes without the user info
    tracker.sync(cfg, manifest, {})
    tracker.finish("FINISHED")  # where MLflow prints its run's URL
    client = mlflow.MlflowClient(uri)
    (parent,) = client.search_runs(
        [client.get_experiment_by_name("credentials").experiment_id], "tags.`subliminal.kind` = 'pipeline'"
    )
    assert parent.data.params["tracking.uri"] == secret_uri.replace(f"alice:{SECRET}", "***")
    config = Path(
        mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="config.json", tracking_uri=uri)
    ).read_text()
    assert (
        SECRET not in json.dumps(parent.data.params)
        and SECRET not in config
        and SECRET not in json.dumps(parent.data.tags)
    )
    assert SECRET not in capsys.readouterr().out
