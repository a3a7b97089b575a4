"""The trainer's GPU path, checked on a bare GPU machine: no Ray, no vLLM, no hub; torch, transformers,
peft (and bitsandbytes, for the 4-bit check) only.

    python bench/gpu_check.py --out gpu_check.json            # one CUDA GPU (H100 80GB)
    python bench/gpu_check.py --only packing,handoff          # some checks only
    python bench/gpu_check.py --smoke --out /tmp/check.json   # CPU, narrow models (the test suite)

Models are Llamas of the real widths with random weights, built on the GPU from a config, saved
once under --workdir (8B: 16 GB, the 70B slice: 11 GB of disk) and loaded by the trainer's own
load_base; every step goes through the project's functions (attach_lora, wrap_distributed,
pack_batch, forward_loss, make_optimizer, train/distill.py, train/outputs.py), not copies.
Checks (bench/gpu_checks/, one module each, whose docstrings say why), with their figures:

- 8b_lora: full-depth 8B, bf16 LoRA r16 on packed micro-batches of the presets' shapes (teacher
  8 x 512, student 16 x 256, and 8 full 512-token rows, the memory plan's bound): tokens/s, MFU
  with and without the embedding/lm_head parameters, peak memory, the SDPA kernel dispatched;
- packing: at those shapes, each example's loss and LoRA gradients packed vs alone (worst gaps),
  under the attention the trainer picks, with a leaking control that shows the check would see a leak;
- 8b_scoring: the transformers engine's own `score` (batch 64, ~250-token WMDP prompts) and
  `generate` (batch 256, number prompts, 22 tokens) at full 8B depth in bf16: questions/s, prefill
  and decode MFU (floors under the vLLM rates docs/scaling.md assumes), and batched scores equal
  to each prompt's alone (left padding and position ids on the GPU's kernels);
- logit_kl_ddp: precomputed teacher targets under a DDP student: KL ~ 0 to an untrained teacher,
  gradients equal to an in-loop teacher's, the teacher frozen and out of the optimizer;
- gradient_checkpointing: the loss and LoRA gradients of a plain run;
- fsdp2_world_size_1: the loss of the bare model;
- 70b_slice_4bit_ddp: 70B width, 4-bit base (bf16 and said so if bitsandbytes is missing), gradient
  checkpointing, a real DDP at world size 1: DDP vs plain gradients under no_sync accumulation, loss
  falls, the trainer's optimizer checkpoint saved and resumed; per-layer weight memory, peak memory
  and step time (4 vs 2 layers) extrapolated to 80 layers, with the formula;
- handoff: a child holding 8B training state is SIGKILLed; seconds until 90% of the GPU is free
  (common/gpu_memory.py) and whether an allocation of 90% of it then succeeds;
- 8b_levers: the trainer's throughput levers (pack_length, Liger kernels, torch.compile, twice the
  rows a micro-step) at the teacher's and student's shapes, each alone and all together: tokens/s,
  MFU, peak memory, and the loss at the same weights against the plain path's.

The JSON (--out) is rewritten (whole, atomically) as each check ends, so a run cut short keeps
what finished; a check that raises is recorded as failed with its error, and the next one runs.
Exit status: 1 if any check failed, 2 without a GPU and without --smoke. In --smoke, on CPU in
float32 with gloo, everything runs except what needs CUDA: 4-bit, MFU and peak memory (null), and
the handoff's GPU memory (its kill and reaping run); those parts say "skipped" and why.
Measured on one H100 80GB (2026-11-26): 106 s, about half of it writing and loading the 27 GB of
model files; if a run is cut short, `--only` runs the rest. The smoke run takes 17 s on 2 CPU cores
(2026-11-27, its nine checks 12 s of it); a first run on a fresh machine was seen to take 351 s,
with Python's and the disk's caches cold.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the project's packages

import torch  # noqa: E402
from gpu_checks import handoff, levers, logit_kl, packing, scoring, slice70b, throughput, wrappers  # noqa: E402
from gpu_checks.shared import Context, free  # noqa: E402

from common.atomic import write_json  # noqa: E402
from train.model import attach_lora, load_base  # noqa: E402

# 8b_levers last: Liger patches transformers' Llama classes for the rest of the process.
CHECKS = (
    "8b_lora",
    "packing",
    "8b_scoring",
    "logit_kl_ddp",
    "gradient_checkpointing",
    "fsdp2_world_size_1",
    "70b_slice_4bit_ddp",
    "handoff",
    "8b_levers",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="CPU, narrow models, few steps")
    parser.add_argument("--out", default="gpu_check.json")
    parser.add_argument(
        "--steps", type=int, default=10, help="timed optimizer steps per shape (the 70B slice takes half)"
    )
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks to run")
    parser.add_argument(
        "--levers",
        default=None,
        help="8b_levers: comma-separated variants only (plain is always measured: the others compare with it)",
    )
    parser.add_argument(
        "--workdir", default=None, help="where the models are written (27 GB on GPU; default: the temp folder)"
    )
    args = parser.parse_args()
    only = [name for name in CHECKS if name in args.only.split(",")]
    if not args.smoke and not torch.cuda.is_available():
        print("error: no CUDA GPU; use --smoke to run the checks on CPU", file=sys.stderr)
        return 2
    steps = min(args.steps, 3) if args.smoke else args.steps
    device = torch.device("cpu") if args.smoke else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True  # as train/loop.py sets them
        torch.backends.cudnn.allow_tf32 = True
    started = time.time()
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "smoke": args.smoke,
        "steps": steps,
        "versions": versions(),
        "checks": {},
    }
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)  # a fresh machine's scratch folder may not exist yet
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="gpu-check-") as tmp:
        ctx = Context(device, args.smoke, Path(tmp))
        torch.distributed.init_process_group(
            "nccl" if ctx.gpu else "gloo", init_method=f"file://{tmp}/process-group", rank=0, world_size=1
        )
        loaded: dict = {}

        def lora_8b():
            if "model" not in loaded:
                loaded["model"] = attach_lora(load_base(ctx.model("8b"), ctx.cfg(), device), ctx.cfg())
            return loaded["model"]

        plan = {
            "8b_lora": lambda: throughput.check_8b_lora(ctx, lora_8b(), steps),
            "packing": lambda: packing.check_packing(ctx, lora_8b()),
            "8b_scoring": lambda: scoring.check_8b_scoring(
                ctx, None if args.smoke else ctx.model("8b"), *((64, 32) if args.smoke else (2048, 1024))
            ),
            "logit_kl_ddp": lambda: logit_kl.check_logit_kl(ctx, ctx.model("8b", layers=2)),
            "gradient_checkpointing": lambda: wrappers.check_gradient_checkpointing(ctx, ctx.model("8b", layers=2)),
            "fsdp2_world_size_1": lambda: wrappers.check_fsdp(ctx, ctx.model("8b", layers=2)),
            "70b_slice_4bit_ddp": lambda: slice70b.check_70b_slice(ctx, max(2, steps // 2)),
            "handoff": lambda: handoff.check_handoff(ctx, ctx.model("8b")),
            "8b_levers": lambda: levers.check_levers(
                ctx, lora_8b(), steps, args.levers.split(",") if args.levers else None
            ),
        }
        try:
            for name in only:
                if name not in ("8b_lora", "packing"):
                    loaded.clear()  # the 8B model's 16 GB go before the next model comes
                result["checks"][name] = run(plan[name], device)
                result["seconds"] = round(time.time() - started, 1)
                write_json(args.out, result)
                print(f"{name}: {verdict(result['checks'][name])} ({result['checks'][name]['seconds']} s)", flush=True)
        finally:
            torch.distributed.destroy_process_group()
    failed = [name for name, c in result["checks"].items() if c["ok"] is False]
    print(
        f"{args.out}: {len(only) - len(failed)} of {len(only)} checks not failed, {round(time.time() - started, 1)} s",
        flush=True,
    )
    return 1 if failed else 0


def run(check, device: torch.device) -> dict:
    started = time.time()
    try:
        out = check()
    except Exception as e:
        out = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    free(device)
    return {**out, "seconds": round(time.time() - started, 1)}


def verdict(check: dict) -> str:
    """ok / FAILED (with the error) / skipped, naming the parts skipped in a check that ran."""
    if check["ok"] is False:
        return "FAILED" + (f": {check['error']}" if "error" in check else "")
    parts = [
        f"{name} skipped: {part['skipped']}"
        for name, part in check.items()
        if isinstance(part, dict) and part.get("ok", 0) is None
    ]
    return ("skipped" if check["ok"] is None else "ok") + (f" ({'; '.join(parts)})" if parts else "")


def versions() -> dict:
    import peft
    import transformers

    found = {name: importlib.util.find_spec(name) is not None for name in ("bitsandbytes", "flash_attn", "pynvml")}
    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "cuda": torch.version.cuda,
        "installed": found,
    }


if __name__ == "__main__":
    sys.exit(main())
