"""The pipeline's Serve applications: started for a phase, torn down when it ends however it ends.

The settings an experiment preset can give the service (`service:` and
`evaluate:` in jobs/experiment/config.py) map onto `serve.settings.ServiceSettings` by
name, in one place (`service_settings`). The LoRA rank the engine must accept
is not a setting: it is the largest rank of the adapters it will serve, so a
preset that trains rank-32 adapters cannot start a service that refuses them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from jobs.experiment.config import ExperimentConfig

REPLICA_LOSS_PATIENCE_S = 1800  # how long a request keeps being resent after its replica died (a 70B
# replica reloads its weights before it answers again)
RUNNING_APPS: set[str] = set()  # Serve apps this driver started and has not deleted yet
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the ranks vLLM's max_lora_rank accepts


def guard_a_local_proxy() -> None:
    """Serve's proxy body guard (serve/proxy_guard.py), at its default limit (the service's default
    `max_body_bytes`), in the environment a Ray that this driver starts inherits, as `python -m
    serve.run` installs it: without it every replica warns that a chunked body reaches it whole. Only
    where no RAY_ADDRESS names a cluster, whose nodes install it where they start (cluster.yaml)."""
    from serve.proxy_guard import CALLBACK, CALLBACK_ENV

    if "RAY_ADDRESS" not in os.environ:
        os.environ.setdefault(CALLBACK_ENV, CALLBACK)


def stop_on_sigterm(*_) -> None:
    """`ray job stop` sends SIGTERM, then SIGKILL a few seconds later: ask Serve to delete this
    run's apps at once (the controller finishes it after we are gone), then exit."""
    from ray import serve

    for app in list(RUNNING_APPS):
        serve.delete(app, _blocking=False)
        print(f"[serve] {app}: teardown requested (SIGTERM)", flush=True)
    sys.exit(143)


def delete_leftover_app(app: str) -> None:
    """Delete this run's Serve application if an earlier driver left it running.

    A driver killed without warning (SIGKILL, its node lost) cannot tear its
    application down, and on a long-lived cluster the replicas keep their GPUs
    and would starve the next training stage. The caller holds the run
    directory's lock, so no live pipeline is using an application of this name.
    """
    from ray import serve

    if app in serve.status().applications:  # never starts Serve where it is not running
        print(f"[serve] {app}: left running by an earlier driver of this run; deleting it", flush=True)
        serve.delete(app)


def result_or_resend(method, request, response, label: str):
    """`response.result()`; when the replica serving it died (killed, out of memory, its engine
    process gone), the same request is sent again until Serve's replacement answers it.

    Requests carry their seeds, so a resent chunk yields what the lost one would have. Errors
    about the request itself (a 4xx, a bug) are raised at once: resending would not change them.
    """
    from ray.exceptions import RayActorError

    from serve.engine import EngineUnavailable

    attempt, deadline = 0, None
    while True:
        try:
            return response.result()
        except (RayActorError, EngineUnavailable) as error:
            deadline = deadline or time.time() + REPLICA_LOSS_PATIENCE_S
            if time.time() > deadline:
                raise
            wait = min(2**attempt, 30)
            attempt += 1
            print(
                f"[serve] {label}: replica lost ({type(error).__name__}); resending in {wait}s (attempt {attempt + 1})",
                flush=True,
            )
            time.sleep(wait)
            response = method.remote(request)


def max_lora_rank(ranks: list[int]) -> int:
    """The smallest rank vLLM accepts that holds every adapter to be served."""
    largest = max(ranks)
    return next((r for r in VLLM_LORA_RANKS if r >= largest), largest)


# Fields of the experiment's `service` and `evaluate` sections that are not a replica's settings:
# where and how many replicas run (start_service's arguments), and what the evaluate phase itself
# reads. Every other field of the two sections must be a ServiceSettings field (`replica_fields`).
PLACEMENT = ("replicas", "cpus_per_replica", "gpus_per_replica")
EVALUATION_ONLY = (
    "chunk",
    "primary_metric",
    "primary_split",
    "primary_direction",
    "primary_comparisons",
    "pooled_test",
    "assumed_tau",
    "permutations",
    "format",
    "probes",
)


def replica_fields(section, not_settings: tuple[str, ...]) -> dict:
    """A config section's fields that configure a replica, each by name; a field that is neither
    a ServiceSettings field nor declared as not one is an error naming it, not a silent drop."""
    from serve.settings import ServiceSettings

    values = {k: v for k, v in dict(section).items() if k not in not_settings}
    if homeless := sorted(set(values) - set(ServiceSettings.model_fields)):
        raise TypeError(
            f"{type(section).__name__} fields {homeless} are no ServiceSettings field: rename them as serve/settings.py names them, "
            "or list them in jobs/runtime/service.py as placement or evaluation only"
        )
    return values


def service_settings(cfg: ExperimentConfig, model_path: str, evaluation: bool, lora_rank: int, adapters: int = 0):
    """ServiceSettings for a phase: the `service` section's replica fields, and under evaluation the
    `evaluate` section's over them; vLLM's host cache of adapters holds all `adapters` the phase
    registers, so none is reread from disk while the phase runs."""
    from serve.settings import ServiceSettings

    values = replica_fields(cfg.service, PLACEMENT)
    if evaluation:
        values.update(replica_fields(cfg.evaluate, PLACEMENT + EVALUATION_ONLY))
    cached = max(ServiceSettings.model_fields["max_cpu_loras"].default, adapters)
    return ServiceSettings(**values, model=model_path, max_lora_rank=lora_rank, max_cpu_loras=cached)


@contextlib.contextmanager
def running_service(
    app: str,
    model_path: str,
    adapters: dict,
    cfg: ExperimentConfig,
    evaluation: bool,
    lora_rank: int,
    span=None,
    models: dict | None = None,
):
    """The Serve application for one phase, deleted when the phase ends however it ends. `span`
    (RunContext.span) is told its start-up, the time it served and its teardown. `models` (name ->
    folder): fully fine-tuned models served beside the base (the transformers engine)."""
    from jobs.runtime.handoff import wait_for_gpus
    from serve.launch import start_service, stop_service

    place = cfg.evaluate if evaluation else cfg.service
    settings = service_settings(cfg, model_path, evaluation, lora_rank, len(adapters))
    if place.gpus_per_replica:  # the last stage's workers or replicas may still hold these GPUs
        wait_for_gpus(settings.gpu_memory_utilization, f"starting {app}")
    beside = f", {len(models)} model(s) beside the base" if models else ""
    print(
        f"[serve] starting {app}: {place.replicas} replica(s), engine {settings.engine}, {len(adapters)} adapter(s){beside}",
        flush=True,
    )
    lane, marks = f"service {'evaluate' if evaluation else 'numbers'} ({Path(model_path).name})", [time.time()]
    handle = start_service(
        settings,
        adapters,
        models=models,
        name=app,
        route_prefix=f"/{app}",
        replicas=place.replicas,
        num_cpus=place.cpus_per_replica,
        num_gpus=place.gpus_per_replica,
        logging_config={
            "enable_access_log": False
        },  # a line per chunk in the job log; the stages print their own progress
    )
    RUNNING_APPS.add(app)
    try:
        health = handle.health.remote(detailed=True).result()  # one replica's: they share settings and resources
        print(
            f"[serve] {app} ready: engine {health['engine']} on {health['device']}, scoring {health['scoring']}",
            flush=True,
        )
        marks.append(time.time())
        yield handle
    finally:
        marks.append(time.time())
        stop_service(app)
        RUNNING_APPS.discard(app)
        print(f"[serve] {app} torn down", flush=True)
        if span is not None and len(marks) == 3:  # started, served and torn down
            for kind, start, end in zip(("start-up", "compute", "teardown"), marks, [*marks[1:], time.time()]):
                span(lane, kind, start, end)
