"""Data preparation: one-pass Ray Data tokenization vs two-pass `datasets.map`.

    python bench/tokenization.py [--rows 20000]

Both produce input_ids and prompt-masked labels for the same rows with the
same tokenizer. The trainer's transform is also timed in-process, to separate
the cost of the work from Ray's fixed costs (actor start, shuffle, write). The Hugging Face way (seed 000) maps once to format the text
and again to tokenize it; this trainer validates the file, tokenizes in one
Ray Data `map_batches` pass, shuffles and writes the parquet cache. Ray's
start-up is excluded; a fresh cache folder forces the work.
"""

import argparse
import tempfile
import time
from pathlib import Path

from bench_common import number_rows, tiny_model, write_rows

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=20000)
    args = parser.parse_args()
    model = tiny_model()
    with tempfile.TemporaryDirectory() as tmp:
        path = write_rows(number_rows(args.rows), Path(tmp) / "rows.jsonl")

        import datasets
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
        started = time.time()
        ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=f"{tmp}/hf")
        ds = ds.map(
            lambda r: {"text": r["prompt"] + r["completion"], "n_prompt": len(tok(r["prompt"]).input_ids)},
            remove_columns=["prompt", "completion"],
        )

        def tokenize(r):
            ids = tok(r["text"]).input_ids + [tok.eos_token_id]
            return {"input_ids": ids, "labels": [-100] * r["n_prompt"] + ids[r["n_prompt"] :]}

        ds = ds.map(tokenize, remove_columns=["text", "n_prompt"])
        hf_s = time.time() - started

        from train.data import Tokenize, read_rows

        started = time.time()
        table, _ = read_rows(path)
        Tokenize(model, 256, "truncate")(
            {"prompt": table["prompt"].to_pylist(), "completion": table["completion"].to_pylist()}
        )
        local_s = time.time() - started

        import ray

        from train.data import tokenize_to_cache

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        started = time.time()
        stats = tokenize_to_cache(path, model, 256, "truncate", 0, Path(tmp) / "cache")
        ray_s = time.time() - started
        assert stats["rows"] == len(ds) and not stats["cached"]
        ray.shutdown()
    print(f"| data preparation ({args.rows} rows) | seconds | rows/s |\n|---|---|---|")
    print(f"| datasets.map format, then tokenize (2 passes) | {hf_s:.1f} | {args.rows / hf_s:.0f} |")
    print(f"| the same one-pass transform in-process (no Ray) | {local_s:.1f} | {args.rows / local_s:.0f} |")
    print(f"| Ray Data one pass + shuffle + parquet cache | {ray_s:.1f} | {args.rows / ray_s:.0f} |")
    print(f"ratio (HF time / Ray time): {hf_s / ray_s:.2f}")
