"""What a training run leaves on disk: checkpoints, snapshots and the finished adapter (or model) folders.

A checkpoint (reported through `ray.train.report`) holds the current adapter
(a PEFT folder; none under full fine-tuning, whose weights file is the model),
its full trained weights, the optimizer and scheduler state,
and `state.json`: the jobs already finished, the job in progress, its step and
its loss per step so far.
That is all a restarted worker group needs to skip finished jobs and resume the
current one mid-way.

Outputs are written by rank 0 directly, since the run directory is shared
storage on a multi-node cluster. A job's files go to a staging folder beside
its output folder, named after the run so that a resumed run finds the
snapshots it already wrote; the staging folder is renamed into place once the
final adapter and `train_metrics.json` are in it. An output folder therefore
holds a finished adapter (and its snapshots) or nothing.
"""

from __future__ import annotations

import json
import pickle
import shutil
import uuid
from pathlib import Path

import torch

from train.model import is_adapter_model, save_trained, trained_parameters
from train.results import METRICS_FILE, TrainResult


def staging_dir(output_dir: Path, run_id: str) -> Path:
    """The folder a job's outputs collect in before the rename (the same for every attempt of a run)."""
    return output_dir.with_name(f".{output_dir.name}.partial-{run_id}")


def finished_by(output_dir: Path, run_id: str) -> bool:
    """Whether `output_dir` holds an adapter this run (storage path + run name) finished."""
    try:
        return json.loads((output_dir / METRICS_FILE).read_text()).get("run_id") == run_id
    except (OSError, ValueError):
        return False


def read_state(checkpoint, first_job: str) -> dict:
    """{done: [job names], job: name or None, step, loss_history: [[step, loss], ...], step_history:
    [[step, time, lr, gradient norm], ...]} of a checkpoint; a fresh start without one.

    A checkpoint written before the trainer ran several jobs has only the step:
    it belongs to the first (only) job. One written before a history was kept
    has none: that history then starts at the resumed step.
    """
    if checkpoint is None:
        return {"done": [], "job": None, "step": 0, "loss_history": [], "step_history": []}
    with checkpoint.as_directory() as d:
        state = json.loads((Path(d) / "state.json").read_text())
    return {
        "done": state.get("done", []),
        "job": state.get("job", first_job),
        "step": state["step"],
        "loss_history": state.get("loss_history", []),
        "step_history": state.get("step_history", []),
    }


def restore(model, checkpoint) -> tuple[dict, dict]:
    """Load a checkpoint's trainable weights into the (unwrapped) model; return (optimizer, scheduler) states."""
    with checkpoint.as_directory() as d:
        d = Path(d)
        weights = load_plain(d / "trainable.pt")
        trained = {name for name, _ in trained_parameters(model)}
        if set(weights) != trained:
            raise RuntimeError(
                f"checkpoint {d} does not match the model's trained weights: {sorted(set(weights) ^ trained)[:3]}"
            )
        model.load_state_dict(weights, strict=False)
        optim = load_plain(d / "optimizer.pt")
    return optim["optimizer"], optim["scheduler"]


def load_plain(path: Path):
    """A checkpoint file of tensors and plain values only (`weights_only`): the storage a cluster
    shares is writable by more than this run, and unpickling anything else would run its code."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = str(e).splitlines()
        why = next((line.strip() for line in lines if "Unsupported global" in line), lines[0] if lines else "")
        raise RuntimeError(
            f"checkpoint file {path} holds objects other than tensors and plain values; refusing to load it ({why})"
        ) from None


def write_checkpoint(d: Path, model, weights: dict, optim: dict, sched: dict, state: dict) -> None:
    """Fill folder `d` with a checkpoint (see the module docstring)."""
    if is_adapter_model(model):  # a full model's copy would double the checkpoint: trainable.pt is it
        save_trained(model, weights, d / "adapter")
    torch.save(weights, d / "trainable.pt")
    torch.save({"optimizer": optim, "scheduler": sched}, d / "optimizer.pt")
    (d / "state.json").write_text(json.dumps(state))


def _replace_dir(tmp: Path, target: Path) -> None:
    if target.exists():  # retrained after a restart: the newer copy wins
        shutil.rmtree(target)
    tmp.rename(target)


def write_snapshot(staging: Path, step: int, model, weights: dict) -> None:
    """Save the adapter (or model) at `step` as `<staging>/snapshots/step-<step>/` (temporary folder, then rename)."""
    folder = staging / "snapshots"
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".step-{step}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        save_trained(model, weights, tmp)
        _replace_dir(tmp, folder / f"step-{step}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def snapshot_steps_in(staging: Path) -> list[int]:
    folder = staging / "snapshots"
    names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
    return sorted(int(n.split("-", 1)[1]) for n in names if n.startswith("step-"))


def finalize(
    output_dir: Path, run_id: str, model, weights: dict, result: TrainResult, with_final_snapshot: bool
) -> TrainResult:
    """Write the final adapter (or model) and its result (train_metrics.json) into the staging folder
    and rename it to `output_dir`.

    Does nothing if this run already finished `output_dir` (a restart re-reached
    the end of a job). Returns the result as written.
    """
    if finished_by(output_dir, run_id):
        return TrainResult.read(output_dir)
    staging = staging_dir(output_dir, run_id)
    staging.mkdir(parents=True, exist_ok=True)
    if with_final_snapshot:
        write_snapshot(staging, result.step, model, weights)
    save_trained(model, weights, staging)
    result = result.model_copy(update={"snapshot_steps": snapshot_steps_in(staging), "run_id": run_id})
    result.write(staging)
    if output_dir.exists():
        output_dir.rmdir()  # empty: the trainer refuses a non-empty one up front
    staging.rename(output_dir)
    return result
