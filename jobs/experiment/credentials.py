"""Credentials that a run uses and never records.

A tracking URI may carry them (`https://user:password@host`, `postgresql://user:password@host/db`,
a `?token=` in its query): `redacted_uri` is the form every log line, MLflow param, config.json and
report provenance holds. A tracking server's token reaches the job as a file, the way the hub
token does (`HF_TOKEN_PATH`): a job's `env_vars` are kept in Ray's job table and its agents' logs,
so only the file's path travels (`MLFLOW_TRACKING_TOKEN_PATH`) and the driver reads the token into
its own environment, where MLflow's client looks for it (`MLFLOW_TRACKING_TOKEN`, read from the
environment only). User and password go in MLflow's own `~/.mlflow/credentials` file instead.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from train.config import ConfigError

TOKEN_PATH = "MLFLOW_TRACKING_TOKEN_PATH"
USER_INFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@")  # scheme://user:password@
SECRET_PARAMETER = re.compile(
    r"([?&;](?:[^=&;#]*(?:password|passwd|pwd|token|secret|key|signature|credential)[^=&;#]*)=)[^&;#]*", re.I
)


def redacted_uri(uri: str | None) -> str | None:
    """`uri` with its user-info part and secret-named query values as `***`; any other URI unchanged."""
    if uri is None:
        return None
    return SECRET_PARAMETER.sub(r"\1***", USER_INFO.sub(r"\1***@", uri))


def without_user_info(uri: str) -> str:
    """`uri` without `user:password@`: what a plain HTTP request (a server's /health) can open."""
    return USER_INFO.sub(r"\1", uri)


def read_tracking_token(environ: os._Environ | dict = os.environ) -> None:
    """Put the token in `MLFLOW_TRACKING_TOKEN_PATH`'s file into this process's `MLFLOW_TRACKING_TOKEN`
    (a token set there already wins). A path that does not hold a token stops the run, named."""
    path = environ.get(TOKEN_PATH)
    if not path or environ.get("MLFLOW_TRACKING_TOKEN"):
        return
    try:
        token = Path(path).read_text().strip()
    except OSError as err:
        raise ConfigError(f"{TOKEN_PATH}={path}: cannot read the tracking token ({err.strerror})") from None
    if not token:
        raise ConfigError(f"{TOKEN_PATH}={path}: the file is empty")
    environ["MLFLOW_TRACKING_TOKEN"] = token
