"""What a run reads from the hub without a pinned revision, and a cluster's images not pinned, for
the job log to warn about.

A hub id names a repository, not its contents: the model or dataset read today may differ from
the one read last month, and a result that rests on it cannot be rerun on the same bytes. A local
folder is fixed (a pre-staged hub snapshot's path even names its commit, `.../snapshots/<sha>`);
the tiny model and the synthetic questions are built here. Until the presets carry a `revision`
per hub source (issue 66, item 4: not yet plumbed through the trainer and the engines), a run
pins its model by pointing `model.path` at a snapshot folder:

    hf download meta-llama/Llama-3.1-8B-Instruct --revision <commit>   # prints the snapshot folder
"""

from __future__ import annotations

import re
from pathlib import Path

from common.model_source import is_hub_id
from jobs.sources.wmdp import HUB_ID


def unpinned(cfg) -> list[str]:
    """One sentence per hub source of `cfg` read at whatever revision the hub has now."""
    found = []
    model = cfg.model.path
    if model != "tiny" and is_hub_id(model) and not Path(model).expanduser().exists():  # a folder of that name is local
        found.append(
            f"model.path {model} is a hub id read at the hub's newest revision, not a pinned one; "
            "pin it with model.path set to a snapshot folder (hf download MODEL --revision COMMIT)"
        )
    if cfg.data.source == "hub":
        found.append(f"data.source hub reads {HUB_ID} at the hub's newest revision, not a pinned one; a folder of its files pins it")
    return found


def unpinned_cluster(launcher: dict | None) -> list[str]:
    """What the launcher config of a head node started by `ray up` (`~/ray_bootstrap_config.yaml`;
    None elsewhere) leaves mutable: a container image named by tag alone, and a node type whose
    machine image is not an `ami-` id (an SSM alias, or none: the launcher's default)."""
    if not launcher:
        return []
    found = []
    image = (launcher.get("docker") or {}).get("image")
    if image and "@sha256:" not in image:
        found.append(f"docker.image {image} is a tag, which can move, not a digest (cluster.yaml shows how to pin it)")
    for name, node in (launcher.get("available_node_types") or {}).items():
        machine = (node.get("node_config") or {}).get("ImageId") or "(none)"
        if not re.fullmatch(r"ami-[0-9a-f]+", machine):
            found.append(f"node type {name}'s ImageId {machine} is not a pinned ami- id")
    return found
