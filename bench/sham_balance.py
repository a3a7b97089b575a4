"""Which draw of the sham's facts does the tiny base answer as often as the true facts?

    python bench/sham_balance.py [--draws 20] [--tolerance 0.03]      # about 30 s on 2 cores, after the tiny model is built

The matched sham (jobs/sources/world.py) learns sigma(cue), one fixed other word per T cue. It
should differ from the teacher only in which facts it holds, so the base model both start from
must not already lean toward one set of facts: a base that picks sigma(cue) more often than the
true answer hands the sham a head start (on world v4's first draw the base picked the sham's fact
8 points more often than the true answer, within one standard error over 48 cues, and the sham then
fitted its facts 0.07-0.12 better than the teacher fitted the true ones). So sigma is rerandomised
for balance on a baseline covariate, as a trial rerandomises its allocation: draws 0, 1, 2, ... of
sigma, each scored on the base alone (no teacher exists at this point), and the world uses the
first draw whose T questions the base answers with the sham's fact as often as with the true answer,
within `--tolerance` on the train and on the held-out split. The criterion is fixed here, before any
teacher of any draw is trained; `world.SHAM_DRAW` records the draw chosen.

Under cloze each choice's text is scored after the question alone, so the base's score of every
word of a subset's bank is computed once per question (the draw changes a T question's choices,
never its wording) and each draw's picks follow from the four it shows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jobs.sources.world import WORLD, world_questions  # noqa: E402


def word_scores(rows: list[dict]) -> list[dict[str, float]]:
    """Per T question, the tiny base's cloze log-likelihood of every word of its subset's bank."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.sources.tiny_model import ensure_tiny_model
    from serve.hf_scoring import cloze_logprobs
    from serve.mc_format import format_cloze_prompt

    path = ensure_tiny_model()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    banks = [list(WORLD[r["subset"]].bank) for r in rows]
    with torch.inference_mode():
        scores = cloze_logprobs(model, tokenizer, [format_cloze_prompt(r["question"], r["subset"]) for r in rows], banks)
    return [dict(zip(bank, s)) for bank, s in zip(banks, scores)]


def lean(rows: list[dict], scores: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """{split: {true, sham}}: how often the base's pick among each question's choices is the true
    answer, and the sham's fact."""
    out = {}
    for split in ("train", "held_out"):
        picks = [(r, max(r["choices"], key=s.__getitem__)) for r, s in zip(rows, scores) if r["split"] == split]
        out[split] = {key: sum(pick == r["choices"][r[key]] for r, pick in picks) / len(picks) for key in ("answer", "sham")}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--tolerance", type=float, default=0.03)
    args = parser.parse_args(argv)
    t_rows = lambda draw: [r for r in world_questions(draw=draw) if r["group"] == "T"]  # noqa: E731
    scores = word_scores(t_rows(0))
    chosen = None
    print("| draw | base on true, train | on sham, train | true, held out | sham, held out | balanced |\n|---|---|---|---|---|---|")
    for draw in range(args.draws):
        by_split = lean(t_rows(draw), scores)
        balanced = all(abs(v["sham"] - v["answer"]) <= args.tolerance for v in by_split.values())
        chosen = draw if chosen is None and balanced else chosen
        cells = " | ".join(f"{by_split[s][k]:.3f}" for s in ("train", "held_out") for k in ("answer", "sham"))
        print(f"| {draw} | {cells} | {balanced} |")
    print(f"first balanced draw: {chosen}")
    return 0 if chosen is not None else 1


if __name__ == "__main__":
    sys.exit(main())
