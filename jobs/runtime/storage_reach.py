"""Storage every node reaches: each alive Ray node writes a marker into the run directory and
Ray Train's storage path, and the driver reads them all, before any work goes to the node.

On a cluster the driver, the training workers and the Serve replicas run on different
nodes, and all of them read and write the run directory (adapters, numbers, checkpoints
under `ray_train/`): it must be one shared filesystem mounted at the same path on every
node. A node with a folder of its own there (its local disk, a mount that failed) would
otherwise fail late and unclearly (Ray Train's "Unable to set up cluster storage" at the
first checkpoint, a replica that finds no adapter) or, worse, write outputs no other node
sees. So `StorageReach.check` runs one task pinned to each node not yet checked
(`NodeAffinitySchedulingStrategy(soft=False)`: never run elsewhere) that writes
`<folder>/.node-reach-<nonce>/<node id>` into a folder the driver made just now, and the
driver reads each marker back: a node that has no such folder, cannot write there, or
writes where the driver does not see it is refused with a RunDirError naming it (its id
and address). The pipeline checks at start and again before each phase, so a node that
joined during a phase is checked before the next one (docs/operations.md, "Many nodes").
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from jobs.rundir.manifest import RunDirError

ANSWER_S = 120.0  # how long a node has to write its markers: its first worker process may take a while to start


def write_markers(folders: list[str], node_id: str) -> list[str]:
    """On one node: `node_id` written into each folder; what went wrong, one line per folder."""
    problems = []
    for folder in folders:
        path = Path(folder)
        if not path.is_dir():
            problems.append(f"does not see {path.parent} as the driver does (no {path.name} in it there)")
            continue
        try:
            (path / node_id).write_text(node_id)
        except OSError as err:
            problems.append(f"cannot write in {path.parent} ({err.strerror or err})")
    return problems


class StorageReach:
    """The folders every node must see, and the nodes already found to see them."""

    def __init__(self, folders: list[Path]):
        self.folders = [Path(f).absolute() for f in folders]
        self.checked: set[str] = set()

    def check(self) -> None:
        """Every alive node not checked yet writes its markers; a RunDirError naming each node that
        could not, or whose markers the driver cannot read. A node that died meanwhile is no refusal."""
        import ray

        nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"] and n["NodeID"] not in self.checked}
        if not nodes:
            return
        nonce = f".node-reach-{uuid.uuid4().hex[:12]}"
        probes = []
        for folder in self.folders:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / nonce).mkdir()
            probes.append(folder / nonce)
        try:
            problems = self._probe(nodes, probes)
        finally:
            for probe in probes:
                shutil.rmtree(probe, ignore_errors=True)
        if problems:
            lines = "\n".join(
                f"  node {node} ({nodes[node]['NodeManagerAddress']}): {why}" for node, why in problems.items()
            )
            raise RunDirError(
                f"not every Ray node sees {' and '.join(map(str, self.folders))} as this driver does:\n{lines}\n"
                "every node must mount the run directory's filesystem at the same path (a shared filesystem); "
                "fix or remove the node named, then rerun (docs/operations.md, 'Many nodes')"
            )
        self.checked |= set(nodes)

    def _probe(self, nodes: dict[str, dict], probes: list[Path]) -> dict[str, str]:
        """{node id: why it fails} after each node's marker task has answered (or not, in ANSWER_S)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # no CPU: a busy or CPU-less node answers too
        task, folders = ray.remote(num_cpus=0, max_retries=0)(write_markers), [str(p) for p in probes]
        refs = {
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                folders, node
            ): node
            for node in nodes
        }
        done, late = ray.wait(list(refs), num_returns=len(refs), timeout=ANSWER_S)
        problems = {refs[ref]: f"did not answer in {ANSWER_S:.0f}s" for ref in late}
        alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        for ref in done:
            node = refs[ref]
            try:
                said = ray.get(ref)
            except ray.exceptions.RayError as err:
                if node in alive:
                    problems[node] = f"its marker task failed: {type(err).__name__}: {str(err).splitlines()[0]}"
                continue
            unseen = [str(p.parent) for p in probes if not (p / node).is_file() or (p / node).read_text() != node]
            if said or unseen:
                problems[node] = "; ".join(said) or f"what it wrote in {', '.join(unseen)} is not there for the driver"
        for ref in late:
            ray.cancel(ref, force=True)
        return problems
