"""LoRA training and batched scoring on one GPU at a realistic width, through Ray Train.

    python bench/gpu_lora.py --layers 32 --steps 30 --out gpu_lora.json   # on a CUDA machine, full 8B depth (--only FSDP: one variant)
    python bench/gpu_lora.py --smoke                        # on CPU: a narrow model, to check the script runs

A Llama with Llama-3.1-8B's width (hidden 4,096, MLP 14,336, 32 heads / 8 KV
heads, vocabulary 128,256) and `--layers` decoder layers is built from a config
with random weights and saved with save_pretrained next to the tiny preset's
tokenizer: nothing is downloaded. Each variant trains the same LoRA (r=16, all
linear layers) through `train_lora` (Ray Train, one GPU worker) on WMDP-format
rows (about 55 tokens each: the default 44 rows make about 2,400 real tokens a
step, the 8B teacher shape of `bench/gpu_check.py`, so the two compare; at 16
rows a step the GPU idles on ~900-token steps); the trainer's own metrics give tokens/s, MFU (4 x parameters x tokens/s
over the GPU's bf16 peak; recomputation not counted) and peak GPU memory.
Then the transformers engine's one-pass scoring (batch 64) is timed on the
same model. Prints a Markdown table for BENCHMARKS.md; `--out` is rewritten
after every variant, so a run cut short keeps what finished, and each stage
prints its elapsed time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench_common import mc_questions, tiny_model, write_rows

VARIANTS = {  # name -> TrainConfig overrides
    "bf16, SDPA": {},
    "bf16, SDPA, gradient checkpointing": {"gradient_checkpointing": True},
    "4-bit base (bitsandbytes NF4)": {"quantization": "4bit"},
    "4-bit base + gradient checkpointing": {"quantization": "4bit", "gradient_checkpointing": True},
    "FSDP2 on 1 GPU, bf16": {"strategy": "fsdp"},
}


def build_wide_model(out: Path, layers: int, smoke: bool) -> str:
    """A randomly initialised Llama of realistic width (or a narrow one for --smoke), saved like a real one."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    width = (
        dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=4, vocab_size=1024)
        if smoke
        else dict(
            hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model())  # ids < 1,024: valid in any larger vocabulary
    config = LlamaConfig(
        num_hidden_layers=layers,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **width,
    )
    torch.manual_seed(0)
    # random init on the GPU: minutes faster at 8B width
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.float32 if smoke else torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def train_variant(
    model_path: str, rows: Path, overrides: dict, steps: int, batch_size: int, use_gpu: bool, tmp: Path
) -> dict:
    from train.config import TrainConfig
    from train.trainer import train_lora

    cfg = TrainConfig(
        num_workers=1,
        use_gpu=use_gpu,
        lora_rank=16,
        lora_alpha=32,
        batch_size=batch_size,
        max_length=512,
        max_steps=steps,
        log_every=max(1, steps // 4),
        checkpoint_every=steps,
        **overrides,
    )
    started = time.time()
    metrics = train_lora(model_path, rows, tmp / f"adapter-{len(list(tmp.iterdir()))}", cfg, cache_dir=tmp / "cache")
    return {**metrics.metrics(), "wall_s": time.time() - started}


def scoring_rate(model_path: str, questions: list[dict]) -> float:
    from serve.hf_engine import HFEngine
    from serve.hf_scoring import mc_logprobs
    from serve.mc_format import format_mc_prompt
    from serve.settings import ServiceSettings

    engine = HFEngine(model_path, ServiceSettings(model=model_path, engine="hf"))
    prompts = [format_mc_prompt(q["question"], q["choices"], q["subject"]) for q in questions]
    mc_logprobs(engine.model, engine.tokenizer, prompts[:64], [4] * 64, 64)  # warm-up
    started = time.perf_counter()
    mc_logprobs(engine.model, engine.tokenizer, prompts, [4] * len(prompts), 64)
    return len(prompts) / (time.perf_counter() - started)


def log(started: float, what: str) -> None:
    print(f"[{time.time() - started:6.0f} s] {what}", flush=True)


def main() -> None:
    import ray
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=44, help="rows per optimizer step (~55 tokens each)")
    parser.add_argument("--smoke", action="store_true", help="narrow model on CPU, GPU-only variants skipped")
    parser.add_argument("--out", type=Path, help="JSON of the figures, rewritten after every variant")
    parser.add_argument("--only", default="", help="run only the variants whose name contains this text (e.g. FSDP)")
    args = parser.parse_args()
    started = time.time()
    use_gpu = torch.cuda.is_available()
    if not use_gpu and not args.smoke:
        raise SystemExit("error: no CUDA GPU here; run with --smoke to check the script on CPU")
    device = torch.cuda.get_device_name() if use_gpu else "CPU (smoke)"
    tmp = Path(tempfile.mkdtemp())
    try:
        model_path = build_wide_model(tmp / "model", args.layers, args.smoke)
        log(started, "model built and saved")
        questions = mc_questions(args.questions if use_gpu else 128)
        from serve.mc_format import choice_continuation, format_mc_prompt

        rows = write_rows(
            [
                {
                    "prompt": format_mc_prompt(q["question"], q["choices"], q["subject"]),
                    "completion": choice_continuation(q["answer"]),
                }
                for q in mc_questions(4000, seed=50)
            ],
            tmp / "rows.jsonl",
        )
        ray.init(include_dashboard=False, log_to_driver=False)
        results = {}
        for name, overrides in VARIANTS.items():
            if args.only not in name:
                continue
            if not use_gpu and "quantization" in overrides:
                continue  # bitsandbytes needs CUDA
            results[name] = train_variant(
                model_path, rows, overrides, args.steps if use_gpu else 4, args.batch_size, use_gpu, tmp
            )
            log(started, f"{name}: {results[name]['tokens_per_s']:,.0f} tokens/s")
            write_figures(args.out, device, args.layers, args.batch_size, results)
        ray.shutdown()
        rate = scoring_rate(model_path, questions)
        write_figures(args.out, device, args.layers, args.batch_size, results, rate)
        log(started, f"scoring: {rate:,.0f} questions/s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"Device: {device}; model: {args.layers} layers at Llama-3.1-8B width{' (smoke: narrow)' if args.smoke else ''}\n"
    )
    print(
        "| variant | tokens/s | real tokens a step | step s | MFU | peak GPU GiB | wall s |\n|---|---|---|---|---|---|---|"
    )
    for name, m in results.items():
        mfu = f"{m['mfu']:.1%}" if m.get("mfu") else "-"
        mem = f"{m['gpu_mem_gib']:.1f}" if m.get("gpu_mem_gib") else "-"
        per_step = m["tokens_per_s"] * m["step_time_s"]
        print(
            f"| {name} | {m['tokens_per_s']:,.0f} | {per_step:,.0f} | {m['step_time_s']:.3f} | {mfu} | {mem} | {m['wall_s']:.0f} |"
        )
    print(f"\nOne-pass scoring, transformers engine, batch 64: {rate:,.0f} questions/s")


def write_figures(
    out: Path | None, device: str, layers: int, batch_size: int, results: dict, scoring_rate: float | None = None
) -> None:
    """The figures so far as JSON (a run cut short keeps what finished)."""
    if out is None:
        return
    keep = ("tokens_per_s", "step_time_s", "padding_fraction", "mfu", "gpu_mem_gib", "loss", "wall_s")
    figures = {
        "device": device,
        "layers": layers,
        "batch_size": batch_size,
        "variants": {name: {k: m.get(k) for k in keep} for name, m in results.items()},
        "scoring_questions_per_s": scoring_rate,
    }
    out.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
