"""jobs/job_log.py: what the pipeline turns down in Ray's output, checked against Ray itself (no cluster)."""

import json
import logging
import warnings

import pytest

from jobs import job_log


@pytest.fixture
def ray_data_loggers():
    """The levels setup_worker touches, restored after the test."""
    names = (*job_log.RAY_DATA_STATUS_LOGGERS, job_log.RAY_DATA_PROGRESS_LOGGER)
    before = {name: logging.getLogger(name).level for name in names}
    yield names
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


def test_the_loggers_it_sets_are_the_ones_ray_data_logs_through():
    """A renamed module in a later Ray would leave its level a no-op: each name is a module's logger."""
    import importlib

    for name in (*job_log.RAY_DATA_STATUS_LOGGERS, job_log.RAY_DATA_PROGRESS_LOGGER):
        assert importlib.import_module(name).logger.name == name


@pytest.mark.parametrize("switch, quiet", [("1", True), ("0", False)])
def test_the_worker_hook_follows_ray_datas_progress_switch(monkeypatch, ray_data_loggers, switch, quiet):
    for name in ray_data_loggers:
        logging.getLogger(name).setLevel(logging.NOTSET)
    monkeypatch.setenv(job_log.PROGRESS_BARS_OFF, switch)
    job_log.setup_worker()
    levels = [logging.getLogger(name).level for name in ray_data_loggers]
    assert levels == ([logging.WARNING, logging.WARNING, logging.ERROR] if quiet else [logging.NOTSET] * 3)


def test_the_worker_hook_silences_rays_exclude_resources_deprecation_only():
    from ray.data import ExecutionOptions, ExecutionResources

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ExecutionOptions(exclude_resources=ExecutionResources(cpu=1))  # what Ray Train's DataConfig does
        assert any("exclude_resources" in str(w.message) for w in caught)
        caught.clear()
        job_log.setup_worker()
        ExecutionOptions(exclude_resources=ExecutionResources(cpu=1))
        warnings.warn("another deprecation", DeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another deprecation"]


def test_the_runtime_env_adds_only_what_the_job_does_not_set(monkeypatch):
    from common import numerics

    for name in (job_log.PROGRESS_BARS_OFF, job_log.HUB_BARS_OFF, job_log.CUBLAS_WORKSPACE, job_log.JOB_CONFIG):
        monkeypatch.delenv(name, raising=False)
    cublas = {job_log.CUBLAS_WORKSPACE: ":4096:8"}  # a GPU run's cuBLAS repeats itself
    hook = "jobs.job_log.setup_worker"
    pinned = {numerics.ENV: "reproducible", **numerics.PINNED}  # the pinned CPU numerics
    assert job_log.runtime_env("reproducible") == {
        "env_vars": {job_log.PROGRESS_BARS_OFF: "1", job_log.HUB_BARS_OFF: "1", **cublas, **pinned},
        "worker_process_setup_hook": hook,
    }
    native = {job_log.PROGRESS_BARS_OFF: "1", job_log.HUB_BARS_OFF: "1", **cublas, numerics.ENV: "native"}
    # native, the default
    assert job_log.runtime_env("native")["env_vars"] == job_log.runtime_env()["env_vars"] == native
    # Progress bars asked back in the driver's environment (a local cluster's workers inherit it).
    monkeypatch.setenv(job_log.PROGRESS_BARS_OFF, "0")
    assert job_log.runtime_env("reproducible")["env_vars"] == {job_log.HUB_BARS_OFF: "1", **cublas, **pinned}
    # A job submitted with its own hook and variables: Ray refuses a key both set, so none is added.
    job = {
        "runtime_env": {
            "env_vars": {job_log.HUB_BARS_OFF: "0", **cublas, **pinned},
            "worker_process_setup_hook": "mine.setup",
        }
    }
    monkeypatch.setenv(job_log.JOB_CONFIG, json.dumps(job))
    assert job_log.runtime_env("reproducible") == {"env_vars": {}}


def test_progress_lines_print_the_first_the_last_and_one_per_interval(capsys):
    from jobs.runtime.progress import ProgressLine

    progress = ProgressLine(every_s=3600)
    printed = [progress.print(f"[numbers] {i}/4 generated", final=i == 4) for i in range(1, 5)]
    assert printed == [True, False, False, True]
    assert capsys.readouterr().out == "[numbers] 1/4 generated\n[numbers] 4/4 generated\n"
    always = ProgressLine(every_s=0)
    assert always.print("a") and always.print("b")
