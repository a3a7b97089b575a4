"""Put a model's weights on every GPU node's local disk once, before a run reads them many times.

    ray job submit --address http://localhost:8265 --working-dir . \
        --runtime-env-json '{"env_vars": {"HF_TOKEN_PATH": "/mnt/shared/secrets/hf_token"}}' \
        -- python jobs/prestage.py meta-llama/Llama-3.1-70B-Instruct [--revision COMMIT] [--dest /mnt/local/models]
    python jobs/prestage.py /mnt/shared/models/my-70b --dest /mnt/local/models   # copy from shared storage

Every training worker and engine replica loads the full base model: 8 workers
and 2 replicas of a 70B model read 141 GB each. From the hub that is a
download per process (and the token in every job); from shared storage, many
readers on one network file system. Staged once per node on local NVMe, every
later load is a local read and the run needs no hub token (set model.path to
the printed folder, or leave the hub id: with `HF_HOME` on that disk, as
cluster.yaml sets it, the hub cache finds the staged files).

One task runs on each alive node (GPU nodes only, unless there are none), pinned
there. A source that is a saved model folder (it holds config.json) is copied
(through a temporary folder and a rename, so a half-copied model never looks
complete); a hub id (`name` or `org/name`) is fetched with
`huggingface_hub.snapshot_download` into the node's hub cache, at `--revision`
when given (a full commit hash: the preset's `model.revision`, so the run then
finds that commit staged; a branch or tag is refused, as it can move). Anything
else is refused on the driver, by the rule the trainer and the service share
(`common.model_source`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python jobs/prestage.py`: import from the repository root
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from common.atomic import atomic_dir  # noqa: E402
from common.model_source import ModelSource, hub_args, model_source, pinned  # noqa: E402


def check_source(source: str, dest: str | None) -> ModelSource:
    """Errors a user can fix, found on the driver before any node does work.

    `source` is classified by the rule the trainer and the service share
    (`common.model_source`): a saved model folder (holding config.json) or a hub id.
    """
    found = model_source(source, what="source")
    if found.is_local and dest is None:
        raise ValueError("copying a folder needs --dest, a folder on each node's local disk")
    return found


def stage_here(source: str, dest: str | None) -> tuple[str, str]:
    """Stage `source` on this node; returns (hostname, local folder). Already staged: no work."""
    found = model_source(source, what="source")
    if found.is_local:
        # as given (a link keeps its name), never "" or ".."
        name = Path(os.path.abspath(Path(source).expanduser())).name
        target = Path(dest).expanduser() / name
        if not (target / "config.json").is_file():
            with atomic_dir(target, replace=True) as tmp:  # a half-copied model never looks complete
                shutil.copytree(found.path, tmp, dirs_exist_ok=True)
        return socket.gethostname(), str(target)
    from huggingface_hub import snapshot_download

    name, pin = hub_args(source)  # a pinned hub id (`org/name@<commit>`): that commit's files
    local_dir = str(Path(dest).expanduser() / source.replace("/", "--")) if dest else None
    path = snapshot_download(
        name, **pin, local_dir=local_dir, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]
    )
    return socket.gethostname(), path


def prestage(source: str, dest: str | None = None) -> list[tuple[str, str]]:
    """Stage `source` on every alive node that has GPUs (or on every node, if none has)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    check_source(source, dest)
    if not ray.is_initialized():
        ray.init()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    gpu_nodes = [n for n in nodes if n["Resources"].get("GPU", 0) > 0]
    task = ray.remote(num_cpus=0)(stage_here)
    pending = [
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote(
            source, dest
        )
        for node in gpu_nodes or nodes
    ]
    return ray.get(pending)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="hub id, or a local/shared folder holding a saved model")
    parser.add_argument(
        "--revision",
        default=None,
        help="a hub id's commit (the full 40-character hash), as in the preset's model.revision",
    )
    parser.add_argument(
        "--dest", default=None, help="folder on each node's local disk (hub ids: default the node's hub cache)"
    )
    args = parser.parse_args()
    try:
        if args.revision and model_source(args.source, what="source").is_local:
            raise ValueError(f"--revision {args.revision}: {args.source} is a folder, and a folder has no revisions")
        staged = prestage(pinned(args.source, args.revision), args.dest)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for host, path in staged:
        print(f"{host}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
