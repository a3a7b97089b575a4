"""The hub token (and a tracking server's token) reaches a job as a file, and is then in no Ray log and no job record.

A job's `env_vars` are kept in Ray's job table (served by the dashboard's jobs API) and written to
the runtime-env agent's log on every node. The documented way (docs/scaling.md) passes
`HF_TOKEN_PATH`, the path of a file only its owner reads, which huggingface_hub reads the token
from: this test submits a job that way to a real head node and finds the token nowhere in Ray's
files or job records, while the job itself reads it. The same job with `HF_TOKEN` in its
`env_vars` leaves the token there: the search can find it.
"""

import hashlib
import json
import sys
import time
from pathlib import Path

import pytest

# starts Ray: a head of its own, on free ports and with no Serve, so it runs beside the tests that bind 8000
pytestmark = [pytest.mark.slow, pytest.mark.own_ports]

TOKEN = "hf_job_secret_5b1e7c0f9a2d4e6b8c3f"
# what the job compares with: the token itself is not in its command
DIGEST = hashlib.sha256(TOKEN.encode()).hexdigest()
READS_IT = f"import hashlib, huggingface_hub, sys; sys.exit(hashlib.sha256((huggingface_hub.get_token() or '').encode()).hexdigest() != '{DIGEST}')"
# The tracking test's own secret: both tests share one head, where each leaves its secret when it passes
# it the old way, so each looks only for its own.
TRACKING_TOKEN = "mlflow_job_secret_9c2e4a7d1f3b6e8a0c5d"


def submit(client, **job) -> str:
    """client.submit_job, again while the head's job agent is still starting: on a loaded machine the
    dashboard answers before the agent has registered, and Ray says so with a 500 ("No available
    agent to submit job, please try again later"; seen once in CI, 9b0411c)."""
    deadline = time.time() + 60
    while True:
        try:
            return client.submit_job(**job)
        except RuntimeError as e:
            if "No available agent" not in str(e) or time.time() > deadline:
                raise
            time.sleep(1)


def submitted(head: dict, env_vars: dict, reads_it: str = READS_IT) -> tuple[str, str]:
    """Run a job that exits 0 only if huggingface_hub (or `reads_it`) finds TOKEN; (its status, everything Ray keeps of it)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(head["dashboard"], headers=head["headers"])
    job = submit(client, entrypoint=f'{sys.executable} -c "{reads_it}"', runtime_env={"env_vars": env_vars})
    deadline = time.time() + 180
    while (status := client.get_job_status(job).value) not in (
        "SUCCEEDED",
        "FAILED",
        "STOPPED",
    ) and time.time() < deadline:
        time.sleep(1)
    records = json.dumps([client.get_job_info(job).dict(), [j.dict() for j in client.list_jobs()]], default=str)
    return status, records + client.get_job_logs(job)


def ray_files_holding(temp_dir: str, text: str) -> list[str]:
    return [
        str(p)
        for p in Path(temp_dir).rglob("*")
        if p.is_file() and not p.is_symlink() and text.encode() in p.read_bytes()
    ]


def test_a_token_file_keeps_the_token_out_of_rays_logs_and_job_records(ray_head, tmp_path):
    token_file = tmp_path / "hf_token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    status, kept = submitted(ray_head, {"HF_TOKEN_PATH": str(token_file)})
    assert status == "SUCCEEDED", kept[-2000:]  # the job read the token from the file
    assert TOKEN not in kept and ray_files_holding(ray_head["temp_dir"], TOKEN) == []
    status, kept = submitted(ray_head, {"HF_TOKEN": TOKEN})  # the way the docs no longer show
    assert status == "SUCCEEDED"
    assert TOKEN in kept or ray_files_holding(ray_head["temp_dir"], TOKEN)


ROOT = Path(__file__).resolve().parent.parent
# The pipeline's own reading (Tracker.for_run calls it), then what MLflow's client would send.
READS_THE_TRACKING_TOKEN = (
    f"import hashlib, sys; sys.path.insert(0, '{ROOT}'); from jobs.experiment.credentials import read_tracking_token; read_tracking_token(); "
    "from mlflow.utils.credentials import get_default_host_creds; "
    f"sys.exit(hashlib.sha256((get_default_host_creds('http://127.0.0.1:5000').token or '').encode()).hexdigest() != "
    f"'{hashlib.sha256(TRACKING_TOKEN.encode()).hexdigest()}')"
)


def test_a_tracking_token_file_keeps_the_token_out_of_rays_logs_and_job_records(ray_head, tmp_path):
    """A team MLflow server's token goes as the hub token does: its file's path in MLFLOW_TRACKING_TOKEN_PATH
    (docs/operations.md, section 5), read by the job into its own process."""
    token_file = tmp_path / "mlflow_token"
    token_file.write_text(TRACKING_TOKEN)
    token_file.chmod(0o600)
    status, kept = submitted(ray_head, {"MLFLOW_TRACKING_TOKEN_PATH": str(token_file)}, READS_THE_TRACKING_TOKEN)
    assert status == "SUCCEEDED", kept[-2000:]  # MLflow's client would send the token from the file
    assert TRACKING_TOKEN not in kept and ray_files_holding(ray_head["temp_dir"], TRACKING_TOKEN) == []
    # the way the docs no longer show
    status, kept = submitted(ray_head, {"MLFLOW_TRACKING_TOKEN": TRACKING_TOKEN}, READS_THE_TRACKING_TOKEN)
    assert status == "SUCCEEDED"
    assert TRACKING_TOKEN in kept or ray_files_holding(ray_head["temp_dir"], TRACKING_TOKEN)
