"""A readable job log: what Ray and its libraries print by default, turned down where it is printed.

The pipeline's own lines (`[phase] ...`: starts, counts, rates, times; `[train]`
from the training workers) are the log. Left alone, Ray Data prints progress
bars and execution start, plan and finish lines for every dataset (each
training run's `split(2, equal=True)` among them), and some warnings say
nothing the reader can act on. Here, in the driver and, through Ray's
`worker_process_setup_hook` (`setup_worker`, which imports nothing heavy), in
every worker process of the job:

- Ray Data's progress bars: off by Ray's own switch, `RAY_DATA_DISABLE_PROGRESS_BARS=1`
  (`DataContext.enable_progress_bars` and `print_on_execution_start` in the
  driver, whose datasets carry its context to their split coordinators; the
  variable, through the job's runtime env, everywhere else); the execution and
  "data sink finished" lines, which no setting turns off, by their loggers' level.
  `RAY_DATA_DISABLE_PROGRESS_BARS=0` in the job's environment brings all of them back.
- transformers' progress bars ("Loading weights" in every replica and training
  worker): `HF_HUB_DISABLE_PROGRESS_BARS=1`, which transformers reads.
- Ray Train's Ray Data config sets `ExecutionOptions.exclude_resources`, which
  Ray 2.60 itself deprecates: that one warning, by its message.

The same runtime env and hook carry the job's CPU numerics (common/numerics.py) to every worker,
replica and task, before their code loads torch.

Elsewhere: Ray Train's per-report and per-checkpoint lines (train/ray_run.py,
train/loop.py), Serve's line per request (jobs/runtime/service.py). Ray keeps
what is not printed in its session's log files (`logs/ray-data`, `logs/train`);
warnings and errors still reach the job log.
"""

from __future__ import annotations

import json
import logging
import os
import warnings

from common import numerics

PROGRESS_BARS_OFF = "RAY_DATA_DISABLE_PROGRESS_BARS"  # Ray Data's own switch; unset in the driver = off
HUB_BARS_OFF = "HF_HUB_DISABLE_PROGRESS_BARS"
# Ray Data's INFO lines that no DataContext field turns off: execution start/plan/finish, "Data sink ... finished".
RAY_DATA_STATUS_LOGGERS = ("ray.data._internal.execution.streaming_executor", "ray.data.dataset")
RAY_DATA_PROGRESS_LOGGER = "ray.data._internal.progress"  # says once per process that the bars are off
# cuBLAS picks among reduction orders by stream workspace unless given a fixed one: this makes a GPU
# run repeat itself on the same GPU model and library versions (docs/scaling.md, "Reproducibility");
# a few MiB per stream, and nothing on a CPU.
CUBLAS_WORKSPACE = "CUBLAS_WORKSPACE_CONFIG"
JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by Ray in a job submitted with `ray job submit`: its runtime env


def _quiet(ray_data: bool) -> None:
    if ray_data:
        for name in RAY_DATA_STATUS_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger(RAY_DATA_PROGRESS_LOGGER).setLevel(logging.ERROR)
    warnings.filterwarnings(
        "ignore", message=r"`ExecutionOptions\.exclude_resources` is deprecated", category=DeprecationWarning
    )


def setup_worker() -> None:
    """Ray's `worker_process_setup_hook` for every worker process of the job: the CPU numerics the
    job's runtime env names (common/numerics.py), loggers and warnings."""
    numerics.setup_worker()
    _quiet(ray_data=os.environ.get(PROGRESS_BARS_OFF) == "1")


def runtime_env(numerics_mode: str = numerics.DEFAULT) -> dict:
    """What the driver's `ray.init` adds to the job's runtime env: the hook, the two switches and
    cuBLAS's fixed workspace where neither the driver's environment nor the job's runtime env sets
    them, and the CPU numerics' variables where the job's runtime env does not (Ray refuses a key
    both set; a job's env vars are in its driver's environment as well, where `numerics.pin`
    checked them)."""
    job = json.loads(os.environ.get(JOB_CONFIG, "{}")).get("runtime_env") or {}
    taken = set(job.get("env_vars", {}))
    defaults = {PROGRESS_BARS_OFF: "1", HUB_BARS_OFF: "1", CUBLAS_WORKSPACE: ":4096:8"}
    env = {name: value for name, value in defaults.items() if name not in os.environ and name not in taken}
    env |= numerics.ray_env_vars(numerics_mode, taken)
    return {"env_vars": env} | (
        {} if "worker_process_setup_hook" in job else {"worker_process_setup_hook": "jobs.job_log.setup_worker"}
    )


def quiet_driver() -> None:
    """The driver's share: Ray Data's context (datasets built here carry it to their split
    coordinators), the same loggers and warnings, transformers' bars."""
    ray_data = os.environ.get(PROGRESS_BARS_OFF, "1") == "1"
    if ray_data:
        from ray.data import DataContext

        context = DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
    if HUB_BARS_OFF not in os.environ:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    _quiet(ray_data)
