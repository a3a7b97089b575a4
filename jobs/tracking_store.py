"""The MLflow store a pipeline's runs go into, reached before any work: its URI, shown without
credentials, checked (a server's /health, a SQLite file's folder and its disk), its experiment
made under a lock when pipelines start together, and the client every write goes through.

Kept apart from what the runs hold (jobs/tracking.py, whose `Tracker` is one of these stores):
reaching a store and telling its failures apart is one concern, the parent and child runs and
what they log another.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import urllib.error
import urllib.request
from pathlib import Path

from common.config import ConfigError
from jobs.experiment.credentials import redacted_uri, without_user_info


class TrackingError(ConfigError):
    """The tracking store cannot be reached or used: raised before any work, naming the URI."""


class TrackingStore:
    """One MLflow store and experiment; the client is made on first use."""

    def __init__(self, uri: str, experiment: str, artifact_root: str | None = None):
        self.uri, self.experiment = uri, experiment
        self.shown = redacted_uri(uri)  # what the log and errors name: no password or token
        if self.shown != uri:  # MLflow's own "View run ... at: <uri>" lines would print the credentials
            os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        self.artifact_root = artifact_root
        self._client = None
        self._experiment_id = None
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # MLflow's client retries for minutes by default
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")

    def check(self) -> None:
        """Reach the store, or raise TrackingError naming the URI (and `tracking: off`)."""
        advice = "start it, fix tracking.uri, or pass --set tracking=off"
        if self.uri.startswith(("http://", "https://")):
            try:
                with urllib.request.urlopen(without_user_info(self.uri).rstrip("/") + "/health", timeout=10) as answer:
                    if answer.status != 200:
                        raise TrackingError(f"tracking.uri {self.shown}: /health answered {answer.status}; {advice}")
            except (urllib.error.URLError, OSError) as err:
                raise TrackingError(
                    f"tracking.uri {self.shown}: cannot reach the MLflow server ({self.hide(getattr(err, 'reason', err))}); {advice}"
                ) from None
        elif self.uri.startswith("sqlite:///"):
            folder = Path(self.uri.removeprefix("sqlite:///")).parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise TrackingError(f"tracking.uri {self.shown}: cannot create {folder} ({err}); {advice}") from None
            if shared := network_filesystem(folder):
                raise TrackingError(
                    f"tracking.uri {self.shown}: a SQLite file on a network file system ({shared}), whose locking SQLite cannot rely on; "
                    "put it on a local disk (MLFLOW_TRACKING_URI=sqlite:////local/path/mlflow.db), use an MLflow server, or pass --set tracking=off"
                )
        try:
            with self.creation_lock():
                self.experiment_id()
        except Exception as err:  # noqa: BLE001 - any failure of the store is the user's to see, named
            raise TrackingError(
                f"tracking.uri {self.shown}: {type(err).__name__}: {self.hide(err)}; {advice}"
            ) from None

    def hide(self, err: object) -> str:
        """An error's first line for the log, with the URI's credentials as `***` wherever it repeats them."""
        text = str(err).replace(self.uri, self.shown)
        return text.splitlines()[0][:300] if text else ""

    @contextlib.contextmanager
    def creation_lock(self):
        """Pipelines starting together on one machine create the embedded store (its tables) and
        the experiment one at a time: SQLite's schema set-up is not safe to race."""
        if not self.uri.startswith("sqlite:///"):
            yield
            return
        with open(self.uri.removeprefix("sqlite:///") + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    @property
    def client(self):
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def experiment_id(self) -> str:
        """The experiment's id, made on first use and looked up once per pipeline."""
        if self._experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            artifacts = self.artifact_root and f"{self.artifact_root}/{self.experiment}"
            self._experiment_id = (
                found.experiment_id
                if found
                else self.client.create_experiment(self.experiment, artifact_location=artifacts)
            )
        return self._experiment_id


NETWORK_FILESYSTEMS = ("nfs", "nfs4", "efs", "cifs", "smb3", "lustre", "fuse.sshfs", "9p")


def network_filesystem(path: Path, mounts: str | None = None) -> str | None:
    """'<type> at <mount point>' when `path` lies on a network file system (the longest mount point
    holding it, in /proc/mounts or `mounts`, that table's text); None on a local disk or where
    the table cannot be read."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    resolved, best = str(Path(path).resolve()), ("", "")
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            point = fields[1].replace("\\040", " ")
            if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) > len(best[0]):
                best = (point, fields[2])
    return f"{best[1]} at {best[0]}" if best[1] in NETWORK_FILESYSTEMS else None


def sqlite_artifact_root(uri: str) -> str | None:
    """A SQLite store keeps its artifacts in `mlflow-artifacts` beside its file. MLflow's default,
    ./mlruns in the working directory, would be lost with a Ray job's uploaded working dir. A
    server chooses its own artifact store."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).absolute().parent / "mlflow-artifacts").as_uri()
