"""Check a Serve config file before deploying it; exit 2 with one line naming the problem.

    python -m serve.preflight serve/config.yaml && serve run serve/config.yaml

Ray 2.60's `serve run CONFIG` builds each application on the cluster and then
waits forever, whether the build succeeded or not: with a missing model or a
bad adapter path it prints the error and keeps running (the CLI never reads
the application's DEPLOY_FAILED status). This runs the same checks the
deployment runs (its settings, the model, the registered adapters, a
tensor-parallel replica's placement group, an `http_options.host` off loopback
without `SERVE_API_KEY`) in the calling process first, so a bad config stops at
once with a non-zero exit. The key is read here from this environment; the
build reads it where Ray started, and refuses the same open host there.
Applications built by anything other than this project's `serve.app:build_app`
are left to Serve.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from pydantic import ValidationError

from common.cli import program
from serve.replica_placement import check_deployment
from serve.settings import (
    ServiceError,
    ServiceSettings,
    api_key_from_env,
    check_open_host,
    check_user_config,
    config_args,
    model_id,
    resolve_model,
)

BUILDER = "serve.app:build_app"


def check_application(app: dict, host: str) -> None:
    """Raise ServiceError naming what in one application of the config would fail its deployment."""
    fields, allow_open_host = config_args(app.get("args"))
    check_open_host(host, api_key_from_env(), allow_open_host)  # as the build checks it, with this environment's key
    try:
        settings = ServiceSettings(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        raise ServiceError(f"args.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    resolve_model(settings.model)
    for deployment in app.get("deployments") or []:
        check_user_config(deployment.get("user_config") or {}, model_id(settings))
        check_deployment(deployment, settings.tensor_parallel_size)


def check_config(path: str | Path) -> list[str]:
    """The names of the applications checked; ServiceError naming the file and application otherwise."""
    try:
        config = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ServiceError(f"{path}: cannot read the config: {err}") from None
    if not isinstance(config, dict) or not isinstance(config.get("applications"), list):
        raise ServiceError(f"{path}: not a Serve config (no 'applications' list)")
    checked = []
    for app in config["applications"]:
        if app.get("import_path") != BUILDER:
            continue
        name = app.get("name", "default")
        try:
            check_application(app, (config.get("http_options") or {}).get("host", "127.0.0.1"))
        except ServiceError as err:
            raise ServiceError(f"{path}: application {name!r}: {err}") from None
        checked.append(name)
    return checked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=program("python -m serve.preflight"), description=__doc__.split("\n\n")[0])
    parser.add_argument("config", metavar="CONFIG.yaml", help="a Serve config file (serve/config.yaml)")
    config = parser.parse_args(argv).config  # --help exits 0, a wrong count of arguments 2
    try:
        checked = check_config(config)
    except ServiceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{config}: {', '.join(checked) or 'no application of this project'} ready to deploy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
