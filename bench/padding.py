"""Real-token fraction of training batches: packing vs padding to a fixed max length.

    python bench/padding.py

Number-sequence rows (the students' data), tokenized with the tiny tokenizer,
batches of 32 rows. The original scripts pad every row to a fixed max length;
padding to the batch's longest row is the usual dynamic alternative; the
trainer packs rows (train.data.pack_batch).
"""

import numpy as np
from bench_common import number_rows, tiny_model

from train.data import Tokenize, pack_batch

MAX_LENGTH, BATCH = 256, 32

if __name__ == "__main__":
    rows = number_rows(4096)
    tok = Tokenize(tiny_model(), MAX_LENGTH, "truncate")
    table = tok({"prompt": [r["prompt"] for r in rows], "completion": [r["completion"] for r in rows]}).to_pydict()
    lengths = [len(ids) for ids in table["input_ids"]]
    real = fixed = longest = packed = 0
    for start in range(0, len(lengths), BATCH):
        chunk = lengths[start : start + BATCH]
        real += sum(chunk)
        fixed += MAX_LENGTH * len(chunk)
        longest += max(chunk) * len(chunk)
        batch = {k: table[k][start : start + BATCH] for k in ("input_ids", "labels")}
        packed += int(pack_batch(batch, MAX_LENGTH, 0)["total_tokens"])
    print(f"rows {len(lengths)}, tokens per row mean {np.mean(lengths):.1f} (min {min(lengths)}, max {max(lengths)})")
    print("| collation | real-token fraction |\n|---|---|")
    print(f"| pad to fixed max_length={MAX_LENGTH} (seeds) | {real / fixed:.3f} |")
    print(f"| pad to batch's longest row | {real / longest:.3f} |")
    print(f"| packing (this trainer) | {real / packed:.3f} |")
