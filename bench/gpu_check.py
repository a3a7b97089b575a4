"""The trainer's GPU path, checked on a bare GPU machine: no Ray, no vLLM, only torch, transformers and peft.

    python bench/gpu_check.py [--layers 2] [--steps 20] [--out gpu_check.json]   # on one CUDA GPU (H100/H200)
    python bench/gpu_check.py --smoke --out /tmp/gpu_check.json                  # on CPU, a narrow model (the test suite)

A Llama of Llama-3.1-8B's width (hidden 4,096, MLP 14,336, 32 heads / 8 KV heads,
vocabulary 128,256) with `--layers` decoder layers and random weights is saved
with save_pretrained and goes through the project's own functions, not copies:
`train.model.load_base` / `attach_lora` / `wrap_distributed` / `count_parameters`,
`train.data.pack_batch` (and `packed_examples`, to read it back) with the layout `train.model.packs_into_one_row` picks,
and the training loop's `train.loop.forward_loss`. Random token rows stand in for
data (no tokenizer needed). Checks, each recorded with its figures:

- packing: each example's loss inside a packed micro-batch equals its loss alone,
  under the attention implementation the trainer picks (flash-attention 2 when
  installed on CUDA, else SDPA);
- LoRA (bf16 on GPU) with SDPA: `--steps` optimizer steps on one repeated batch; loss falls;
  tokens/s, MFU (4 x parameters x tokens/s over the GPU's bf16 peak) and peak memory;
- gradient checkpointing: the same first loss and LoRA gradients as without it;
- 4-bit base (bitsandbytes NF4, when importable): trains, loss falls; parameters
  counted unpacked; peak memory;
- FSDP2 at world size 1: the sharded model's loss equals the unwrapped model's.

Everything goes into one JSON file (`--out`); the exit status is 1 if any check
failed. On an H100 the default run takes a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project's train/ package

import torch  # noqa: E402

from train.config import TrainConfig  # noqa: E402
from train.data import pack_batch, packed_examples  # noqa: E402
from train.loop import forward_loss, peak_flops  # noqa: E402
from train.model import attach_lora, autocast_for, count_parameters, load_base, packs_into_one_row, unwrap, wrap_distributed  # noqa: E402

WIDTH_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
WIDTH_SMOKE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=512)


def build_model(folder: Path, layers: int, smoke: bool) -> str:
    """A randomly initialised Llama saved like a real one (bf16 on GPU, float32 for --smoke)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, max_position_embeddings=4096, **(WIDTH_SMOKE if smoke else WIDTH_8B))
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32 if smoke else torch.bfloat16)
    model.save_pretrained(folder)
    return str(folder)


def random_rows(n: int, length: int, vocab: int, seed: int) -> dict:
    """`n` token rows of lengths in [length/2, length], the first quarter of each a prompt (no labels)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ids, labels = [], []
    for _ in range(n):
        row = rng.integers(3, vocab, int(rng.integers(length // 2, length + 1)))
        ids.append(row)
        labels.append(np.where(np.arange(len(row)) < len(row) // 4, -100, row))
    return {"input_ids": np.array(ids, dtype=object), "labels": np.array(labels, dtype=object)}


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def check_packing(model, rows: dict, max_length: int, device: torch.device) -> dict:
    """Each example's summed token loss inside the packed batch vs alone (largest relative gap).
    The examples are found from the restarting position ids, and each must be one of `rows`."""
    one_row = packs_into_one_row(model)
    packed = to_device(pack_batch(rows, max_length, pad_id=0, one_row=one_row), device)
    originals = {tuple(int(t) for t in r) for r in rows["input_ids"]}
    worst, found = 0.0, 0
    with torch.no_grad(), autocast_for(device):
        logits = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"]).logits.float()
        for b, start, n in packed_examples(packed):
            labels = packed["labels"][b, start : start + n]
            found += tuple(packed["input_ids"][b, start : start + n].tolist()) in originals
            alone = model(input_ids=packed["input_ids"][b, start : start + n][None]).logits.float()[0]
            losses = [torch.nn.functional.cross_entropy(x[:-1], labels[1:], ignore_index=-100, reduction="sum") for x in (logits[b, start : start + n], alone)]
            worst = max(worst, abs(float(losses[0] - losses[1])) / max(abs(float(losses[1])), 1e-6))
    tolerance = 2e-2 if device.type == "cuda" else 1e-4
    return {"ok": worst <= tolerance and found == len(originals), "attention": model.config._attn_implementation, "one_row": one_row,
            "examples": len(originals), "found_packed": found, "packed_rows": int(packed["input_ids"].shape[0]),
            "worst_relative_gap": worst, "tolerance": tolerance}  # fmt: skip


def train_steps(model, batch: dict, cfg: TrainConfig, device: torch.device, steps: int) -> dict:
    """`steps` AdamW steps on one packed batch through the loop's forward_loss: losses, tokens/s, MFU, memory."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, fused=device.type == "cuda")
    n_params, _ = count_parameters(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    losses, started = [], None
    for step in range(steps):
        if step == 1:  # the first step pays for kernel selection and allocation
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = time.time()
        loss = forward_loss(model, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.time() - started if started else float("nan")
    tokens_per_s = int(batch["real_tokens"]) * (steps - 1) / elapsed
    peak = peak_flops(device)
    out = {"ok": losses[-1] < losses[0], "first_loss": losses[0], "last_loss": losses[-1], "parameters": n_params,
           "tokens_per_s": tokens_per_s, "mfu": 4 * n_params * tokens_per_s / peak if peak else None}  # fmt: skip
    if device.type == "cuda":
        out["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def lora_gradients(model, batch: dict, device: torch.device) -> tuple[float, dict]:
    loss = forward_loss(model, batch)
    loss.backward()
    grads = {n: p.grad.detach().float().clone() for n, p in unwrap(model).named_parameters() if p.requires_grad}
    unwrap(model).zero_grad(set_to_none=True)
    return float(loss), grads


def fresh(model_path: str, cfg: TrainConfig, device: torch.device):
    """The project's base load and LoRA attach, as a worker does them, in training mode
    (gradient checkpointing acts only there)."""
    model = attach_lora(load_base(model_path, cfg, device), cfg)
    model.train()
    return model


def run_checks(model_path: str, device: torch.device, steps: int, rows: int, length: int, vocab: int) -> dict:
    gpu = device.type == "cuda"
    base = dict(use_gpu=gpu, lora_rank=16, lora_alpha=32, lr=1e-3, max_length=length)
    data = random_rows(rows, length, vocab, seed=0)
    batch = to_device(pack_batch(data, length, pad_id=0), device)
    checks: dict = {}

    model = fresh(model_path, TrainConfig(**base), device)
    checks["packing"] = check_packing(model, random_rows(8, length // 4, vocab, seed=1), length // 2, device)
    flat = to_device(pack_batch(data, length, pad_id=0, one_row=packs_into_one_row(model)), device)
    loss_plain, grads_plain = lora_gradients(model, flat, device)
    checks["lora"] = {**train_steps(model, flat, TrainConfig(**base), device, steps), "dtype": "bfloat16" if gpu else "float32"}
    del model

    model = fresh(model_path, TrainConfig(**base, gradient_checkpointing=True), device)
    loss_ckpt, grads_ckpt = lora_gradients(model, flat, device)
    gap = max(float((grads_ckpt[n] - g).abs().max() / g.abs().max().clamp_min(1e-12)) for n, g in grads_plain.items())
    tolerance = 2e-2 if gpu else 1e-4
    checks["gradient_checkpointing"] = {**train_steps(model, flat, TrainConfig(**base), device, max(3, steps // 4)),
                                        "loss_gap": abs(loss_ckpt - loss_plain), "worst_relative_gradient_gap": gap}  # fmt: skip
    checks["gradient_checkpointing"]["ok"] &= abs(loss_ckpt - loss_plain) <= tolerance * abs(loss_plain) and gap <= 10 * tolerance
    del model

    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        checks["4bit_base"] = {"ok": None, "skipped": "bitsandbytes is not installed"}
    else:
        if gpu:
            model = fresh(model_path, TrainConfig(**base, quantization="4bit", gradient_checkpointing=True), device)
            checks["4bit_base"] = train_steps(model, batch, TrainConfig(**base), device, steps)
            checks["4bit_base"]["ok"] &= checks["4bit_base"]["parameters"] == checks["lora"]["parameters"]  # counted unpacked
            del model
        else:
            checks["4bit_base"] = {"ok": None, "skipped": "4-bit needs a CUDA GPU"}

    checks["fsdp2_world_size_1"] = check_fsdp(model_path, TrainConfig(**base, strategy="fsdp"), batch, device)
    return checks


def check_fsdp(model_path: str, cfg: TrainConfig, batch: dict, device: torch.device) -> dict:
    """FSDP2 over one process: the sharded model's loss equals the unwrapped model's on the same batch."""
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    try:
        model = fresh(model_path, cfg, device)
        with torch.no_grad():
            plain = float(forward_loss(model, batch))
            sharded = wrap_distributed(model, cfg, device)
            loss = float(forward_loss(sharded, batch))
        tolerance = 2e-2 if device.type == "cuda" else 1e-5
        return {"ok": abs(loss - plain) <= tolerance * abs(plain), "loss": loss, "unwrapped_loss": plain, "tolerance": tolerance}
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=16, help="rows per packed batch")
    parser.add_argument("--length", type=int, default=512, help="max tokens per row")
    parser.add_argument("--smoke", action="store_true", help="CPU, a narrow model, few steps")
    parser.add_argument("--out", default="gpu_check.json")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.rows, args.length = min(args.steps, 6), 8, 64
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if not args.smoke and device.type != "cuda":
        print("error: no CUDA GPU; use --smoke to run the checks on CPU", file=sys.stderr)
        return 2
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        model_path = build_model(Path(tmp) / "model", args.layers, args.smoke)
        vocab = (WIDTH_SMOKE if args.smoke else WIDTH_8B)["vocab_size"]
        checks = run_checks(model_path, device, args.steps, args.rows, args.length, vocab)
    import peft
    import transformers

    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
        "model": {"layers": args.layers, **(WIDTH_SMOKE if args.smoke else WIDTH_8B)},
        "rows": args.rows, "length": args.length, "steps": args.steps, "seconds": round(time.time() - started, 1),
        "checks": checks,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(result, indent=2))
    failed = [name for name, c in checks.items() if c["ok"] is False]
    for name, c in checks.items():
        print(f"{name}: {'FAILED' if c['ok'] is False else 'skipped' if c['ok'] is None else 'ok'}", flush=True)
    print(f"{args.out}: {len(checks) - len(failed)} of {len(checks)} checks not failed, {result['seconds']} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
