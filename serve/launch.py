"""Start, update and stop the inference service from Python (the pipeline's way in).

    from serve.launch import start_service
    handle = start_service(ServiceSettings(model="tiny"), adapters={"teacher": "runs/tiny/teacher/adapter"})
    handle.generate.remote(GenerateRequest(prompts=["..."])).result()

The handle calls the deployment's route methods directly (no HTTP); the same
application answers HTTP at http://127.0.0.1:8000<route_prefix>.
"""

from __future__ import annotations

from ray import serve

from serve.app import proxy_host, service_app
from serve.replica_placement import replica_options
from serve.settings import ServiceSettings, api_key_from_env, check_open_host

DEFAULT_APP = "subliminal"


def start_service(
    settings: ServiceSettings,
    adapters: dict[str, str] | None = None,
    *,
    models: dict[str, str] | None = None,
    name: str = DEFAULT_APP,
    route_prefix: str = "/",
    replicas: int = 1,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    max_ongoing_requests: int | None = None,
    max_queued_requests: int | None = None,
    health_check_period_s: float | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    logging_config: dict | None = None,
    allow_open_host: bool = False,
):
    """Deploy the application `name` (replacing one of that name) and return its deployment handle.

    `models` (name -> folder) are fully fine-tuned copies of the base served beside it, by the
    transformers engine only. Calling it again with other adapters redeploys: Serve's Python API restarts
    the replicas (a rolling update). Editing `user_config` in a Serve config file
    and running `serve deploy` instead updates the replicas in place. A tensor-parallel
    replica gets a placement group of `num_gpus` one-GPU bundles (serve/replica_placement.py).
    `health_check_period_s`: how often Serve asks a replica's health (None: the deployment's 10 s;
    Serve replaces a replica after 3 failed checks in a row). `logging_config` is Serve's for the
    application's replicas (`{"enable_access_log": False}`: no line per request). A host other than
    loopback needs $SERVE_API_KEY, or `allow_open_host=True` (a private network the caller vouches
    for): anyone who reaches it could use the models.
    """
    api_key = api_key_from_env()
    check_open_host(host, api_key, allow_open_host)
    serve.start(http_options={"host": host, "port": port})
    running = proxy_host()  # a Serve already running keeps the host it was started on, whatever was asked
    if running is not None and running != host:
        check_open_host(running, api_key, allow_open_host)
    options = {"num_replicas": replicas, **replica_options(settings.tensor_parallel_size, num_cpus, num_gpus)}
    if max_ongoing_requests is not None:
        options["max_ongoing_requests"] = max_ongoing_requests
    if max_queued_requests is not None:
        options["max_queued_requests"] = max_queued_requests
    if health_check_period_s is not None:
        options["health_check_period_s"] = health_check_period_s
    app = service_app(settings, adapters, models, **options)
    return serve.run(app, name=name, route_prefix=route_prefix, logging_config=logging_config)


def stop_service(name: str = DEFAULT_APP) -> None:
    """Tear the application down and free its replicas' resources."""
    serve.delete(name)
