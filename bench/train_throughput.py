"""Training throughput: the Ray trainer (1 and 2 workers) vs a plain Hugging Face Trainer.

    python bench/train_throughput.py [--steps 48]

Same tiny model, same LoRA (r=8, all linear layers), same number-sequence rows,
same optimizer steps and global batch (32 rows per step). The HF Trainer pads
each batch to its longest row (dynamic padding, its usual collator); the Ray
trainer packs. Tokenization is done before timing for both. Reported: wall
time of the training call (the Ray one includes starting workers and loading
the model in them) and real (non-padding) tokens per second.
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench_common import number_rows, tiny_model, write_rows


def hf_trainer(model_path: str, path: Path, steps: int, out: str) -> tuple[float, float]:
    import torch
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Trainer, TrainingArguments

    from train.config import TrainConfig
    from train.data import Tokenize

    rows = [json.loads(line) for line in path.read_text().splitlines()]
    table = Tokenize(model_path, 256, "truncate")(
        {"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}
    )
    features = [
        {"input_ids": ids, "labels": labels}
        for ids, labels in zip(table["input_ids"].to_pylist(), table["labels"].to_pylist())
    ]
    tok = AutoTokenizer.from_pretrained(model_path)
    from train.model import load_lora_model

    model = load_lora_model(model_path, TrainConfig(), torch.device("cpu"))
    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=32,
        max_steps=steps,
        learning_rate=2e-3,
        warmup_steps=max(1, steps // 20),
        lr_scheduler_type="cosine",
        logging_steps=1000,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=features, data_collator=DataCollatorForSeq2Seq(tok, padding=True)
    )
    started = time.time()
    trainer.train()
    seconds = time.time() - started
    # Real tokens seen: the first steps * 32 rows in the order the trainer drew them is not exposed;
    # use the mean row length (the random sample's expectation) instead.
    mean_len = sum(len(f["input_ids"]) for f in features) / len(features)
    return seconds, steps * 32 * mean_len / seconds


def ray_trainer(model_path: str, path: Path, steps: int, workers: int, out: Path, cache: Path) -> tuple[float, float]:
    from train.config import TrainConfig
    from train.trainer import train_lora

    cfg = TrainConfig(
        num_workers=workers, batch_size=32 // workers, max_steps=steps, log_every=steps // 4, checkpoint_every=steps
    )
    started = time.time()
    metrics = train_lora(model_path, path, out / f"w{workers}", cfg, cache_dir=cache)
    return time.time() - started, metrics.tokens_per_s


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    model = tiny_model()
    tmp = Path(tempfile.mkdtemp())
    try:
        path = write_rows(number_rows(2048), tmp / "rows.jsonl")
        hf_s, hf_tps = hf_trainer(model, path, args.steps, str(tmp / "hf"))

        import ray

        from train.data import tokenize_to_cache

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        tokenize_to_cache(path, model, 256, "truncate", 0, tmp / "cache")  # not timed, as for HF
        results = {w: ray_trainer(model, path, args.steps, w, tmp, tmp / "cache") for w in (1, 2)}
        ray.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"| trainer ({args.steps} steps x 32 rows) | wall s | real tokens/s | tokens/s vs HF |\n|---|---|---|---|")
    print(f"| HF Trainer, 1 process, dynamic padding | {hf_s:.1f} | {hf_tps:.0f} | 1.00 |")
    for w, (s, tps) in results.items():
        print(f"| Ray trainer, {w} worker(s), packing | {s:.1f} | {tps:.0f} (last window) | {tps / hf_tps:.2f} |")
