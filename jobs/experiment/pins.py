"""Each hub source's pinned commit (the `revision` keys), and what a run reads unpinned, for the
job log to warn about: hub sources without a revision, and a cluster's images not pinned.

A hub id names a repository, not its contents: the model or dataset read today may differ from
the one read last month, and a result that rests on it cannot be rerun on the same bytes. A
preset pins each hub source to one commit: `model.revision` (the teacher's base),
`arms.<name>.base_revision` (an arm's other base) and `data.revision` (`data.source: hub`, cais/wmdp),
each the full 40-character hash, since a branch or tag name can move. Every reader then reads that
commit (common/model_source.py). A local folder is fixed and has no revisions (a pre-staged hub
snapshot's path even names its commit, `.../snapshots/<sha>`); the tiny model and the synthetic
questions are built here. Today's commit of a source, for an operator to write into the preset:

    python -c "from huggingface_hub import HfApi; print(HfApi().model_info('meta-llama/Llama-3.1-8B-Instruct').sha)"
    python -c "from huggingface_hub import HfApi; print(HfApi().dataset_info('cais/wmdp').sha)"
"""

from __future__ import annotations

import re
from pathlib import Path

from common.config import ConfigError
from common.model_source import is_commit, is_hub_id
from jobs.sources.wmdp import HUB_ID


def commit_command(repo: str, kind: str = "model") -> str:
    """The command that prints `repo`'s commit on the hub today (`kind`: model or dataset)."""
    return f"python -c \"from huggingface_hub import HfApi; print(HfApi().{kind}_info('{repo}').sha)\""


def is_hub_model(path: str) -> bool:
    """Whether a model string is read from the hub: a hub id with no local folder of that name."""
    return path not in ("tiny", "same", "other") and is_hub_id(path) and not Path(path).expanduser().exists()


def other_bases(cfg) -> dict[str, tuple[str, str | None]]:
    """{arm name: (base, base_revision)} of the arms declaring a base of their own."""
    return {
        name: (arm.base, arm.base_revision)
        for name, arm in cfg.arms.items()
        if arm.base not in ("same", cfg.model.path) or arm.base_revision
    }


def check_revisions(cfg) -> None:
    """Each revision key set is a full commit hash of a hub source, or a ConfigError names the key."""
    _check("model.revision", cfg.model.revision, cfg.model.path, "model.path", commit_command(cfg.model.path))
    if cfg.data.revision is not None:
        _check(
            "data.revision",
            cfg.data.revision,
            HUB_ID if cfg.data.source == "hub" else cfg.data.source,
            "data.source",
            commit_command(HUB_ID, "dataset"),
        )
    for name, (base, revision) in other_bases(cfg).items():
        if base == "same":
            raise ConfigError(
                f"arms.{name}.base_revision: the arm is on the teacher's base, which model.revision pins; leave it unset"
            )
        _check(f"arms.{name}.base_revision", revision, base, f"arms.{name}.base", commit_command(base))


def _check(key: str, revision: str | None, source: str, source_key: str, command: str) -> None:
    if revision is None:
        return
    if source == "synthetic" or not is_hub_model(source):
        raise ConfigError(
            f"{key}: {source_key} {source!r} is not read from the hub (a folder, or built here), and a folder has no revisions; leave it unset"
        )
    if not is_commit(revision):
        raise ConfigError(
            f"{key}: {revision!r} is not a commit hash; a branch or tag name can move to other files, so give the full "
            f"40-character commit (lower-case hex), e.g. from `{command}`"
        )


def unpinned(cfg) -> list[str]:
    """One sentence per hub source of `cfg` read at whatever revision the hub has now."""
    found = []
    model = cfg.model.path
    if is_hub_model(model) and not cfg.model.revision:
        found.append(
            f"model.path {model} is a hub id read at the hub's newest revision; pin it with model.revision, its commit (`{commit_command(model)}`)"
        )
    for name, (base, revision) in other_bases(cfg).items():
        if is_hub_model(base) and not revision:
            found.append(
                f"arms.{name}.base {base} is a hub id read at the hub's newest revision; pin it with arms.{name}.base_revision (`{commit_command(base)}`)"
            )
    if cfg.data.source == "hub" and not cfg.data.revision:
        found.append(
            f"data.source hub reads {HUB_ID} at the hub's newest revision; pin it with data.revision, its commit (`{commit_command(HUB_ID, 'dataset')}`)"
        )
    return found


def unpinned_cluster(launcher: dict | None) -> list[str]:
    """What the launcher config the cluster's autoscaler runs with (train/cluster.py
    load_launcher_config; None without one) leaves mutable: a container image named by tag alone,
    and, on AWS, a node type whose machine image is not an `ami-` id (an SSM alias, or none: the
    launcher's default). Other providers (a local `fake_multinode` test cluster) have no machine image."""
    if not launcher:
        return []
    found = []
    image = (launcher.get("docker") or {}).get("image")
    if image and "@sha256:" not in image:
        found.append(f"docker.image {image} is a tag, which can move, not a digest (cluster.yaml shows how to pin it)")
    if (launcher.get("provider") or {}).get("type") != "aws":
        return found
    for name, node in (launcher.get("available_node_types") or {}).items():
        machine = (node.get("node_config") or {}).get("ImageId") or "(none)"
        if not re.fullmatch(r"ami-[0-9a-f]+", machine):
            found.append(f"node type {name}'s ImageId {machine} is not a pinned ami- id")
    return found
