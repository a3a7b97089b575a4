"""Which draws of the sham's facts does a base answer as often as the true facts? The table behind
the rule the pipeline applies to its own base (jobs/sources/sham_draw.py: the first balanced draw).

    python bench/sham_balance.py [--draws 20] [--model DIR]      # about 30 s on 2 cores, after the tiny model is built

Each draw's row: how often the base's pick among a T question's four choices is the true answer,
and how often it is the sham's fact, on the train and the held-out split; balanced within
sham_draw.TOLERANCE on both.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.sources import sham_draw  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.sources.tiny_model import ensure_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument(
        "--model", default=None, help="a base model folder (default: the tiny preset's, built if needed)"
    )
    args = parser.parse_args(argv)
    path = args.model or ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    table = sham_draw.draw_table(sham_draw.word_scores(model, AutoTokenizer.from_pretrained(path)), args.draws)
    print(f"base {path}, weights sha256 {sham_draw.weights_digest(path)[:16]}")
    print(
        "| draw | base on true, train | on sham, train | true, held out | sham, held out | balanced |\n|---|---|---|---|---|---|"
    )
    for row in table:
        cells = " | ".join(f"{row['lean'][s][k]:.3f}" for s in ("train", "held_out") for k in ("answer", "sham"))
        print(f"| {row['draw']} | {cells} | {row['balanced']} |")
    chosen = next((row["draw"] for row in table if row["balanced"]), None)
    print(f"first balanced draw: {chosen}")
    return 0 if chosen is not None else 1


if __name__ == "__main__":
    sys.exit(main())
