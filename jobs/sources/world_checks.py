"""The tiny world's checks: does the base know its facts and not the teacher's, and can it count?

Printed by the base model's builder and asserted by the tests on the built
base (tests/jobs/sources/test_world_checks.py) and on a real pipeline run's
teacher (tests/jobs/test_pipeline.py). Questions are scored by cloze
(each choice's text after the question, serve/hf_scoring.cloze_logprobs), the
format the tiny presets use: no order of the choices enters the prompt, so
"over orders" reads "as scored". Targets (measured figures in BENCHMARKS.md):

    base     K held-out (known)        >= 0.6
    base     T held-out                <= 0.35
    teacher  T held-out                >= 0.6, and >= base + 0.3
    any      most-picked position      <= 35% of answers (of the data's order)
    base     number completions kept   no lower than the world-v2 base's 0.89 (measured so)
    base     sham's facts (T, world v4) picked as often as the true answers, within 0.03
             (the draw a run uses is chosen so, on its base: jobs/sources/sham_draw.py)

    python -m jobs.sources.world_checks [--model DIR] [--teacher ADAPTER_DIR]
"""

from __future__ import annotations

import argparse
from collections import Counter

TARGETS = {
    "known": 0.6,
    "t_base_max": 0.35,
    "teacher": 0.6,
    "teacher_gain": 0.3,
    "position_max": 0.35,
    "numbers_kept": 0.89,
    "sham_balance": 0.03,
}


def cloze_scores(model, tokenizer, rows: list[dict]) -> dict:
    """{accuracy, most_picked_position (share of answers at the most-picked position of the data's
    order), n, and where the rows carry the sham's fact, sham_accuracy} of a model on rows, scored by cloze."""
    from serve.hf_scoring import cloze_logprobs
    from serve.mc_format import format_cloze_prompt

    model.eval()
    logprobs = cloze_logprobs(
        model, tokenizer, [format_cloze_prompt(r["question"], r["subset"]) for r in rows], [r["choices"] for r in rows]
    )
    picks = [max(range(len(lp)), key=lp.__getitem__) for lp in logprobs]
    accuracy = sum(p == r["answer"] for p, r in zip(picks, rows)) / len(rows)
    out = {"accuracy": accuracy, "most_picked_position": max(Counter(picks).values()) / len(picks), "n": len(rows)}
    if all("sham" in r for r in rows):
        out["sham_accuracy"] = sum(p == r["sham"] for p, r in zip(picks, rows)) / len(rows)
    return out


def numbers_kept(model, tokenizer, n: int = 200, seed: int = 98765) -> float:
    """Share of completions of unseen number prompts (temperature 1) that pass the paper's filter."""
    import torch

    from jobs.sources.number_sequences import make_prompts, reject_reason

    chat = [
        tokenizer.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False, add_generation_prompt=True)
        for p in make_prompts(n, seed=seed)
    ]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(chat, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(
            **enc, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=48, pad_token_id=tokenizer.pad_token_id
        )
    texts = tokenizer.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    return sum(reject_reason(t) is None for t in texts) / len(texts)


def base_checks(model, tokenizer, numbers: bool = True, draw: int | None = None) -> dict:
    """A model's row of the table: accuracy on each split, position bias, and (`numbers`) the
    share of its number completions the filter keeps; T questions of the sham's draw `draw`
    (default: world.SHAM_DRAW)."""
    from jobs.sources.world import SHAM_DRAW
    from jobs.sources.world_questions import world_questions

    rows = world_questions(draw=SHAM_DRAW if draw is None else draw)
    return {
        "known": cloze_scores(model, tokenizer, [r for r in rows if r["split"] == "known"]),
        "held_out": cloze_scores(model, tokenizer, [r for r in rows if r["split"] == "held_out"]),
        "train": cloze_scores(model, tokenizer, [r for r in rows if r["split"] == "train"]),
    } | ({"numbers_kept": numbers_kept(model, tokenizer)} if numbers else {})


def table(checks: dict[str, dict]) -> str:
    """The checks of several models (name -> base_checks-like dict) as a Markdown table."""
    lines = [
        "| model | train (T) | held-out (T) | known (K) | most-picked position | numbers kept |",
        "|---|---|---|---|---|---|",
    ]
    for name, c in checks.items():
        position = max(c[s]["most_picked_position"] for s in ("train", "held_out", "known"))
        kept = f"{c['numbers_kept']:.3f}" if "numbers_kept" in c else "-"
        lines.append(
            f"| {name} | {c['train']['accuracy']:.3f} | {c['held_out']['accuracy']:.3f} | {c['known']['accuracy']:.3f} | {position:.3f} | {kept} |"
        )
    return "\n".join(lines)


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.files import tiny_model_link
    from jobs.sources.sham_draw import choose_draw

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a base model folder (default: the tiny preset's)")
    parser.add_argument("--teacher", default=None, help="a LoRA adapter folder over it, checked too")
    args = parser.parse_args()
    path = args.model or str(tiny_model_link())
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    draw = choose_draw(model, tokenizer)["sham_draw"]  # the draw a run on this base uses
    checks = {"base": base_checks(model, tokenizer, draw=draw)}
    if args.teacher:
        from peft import PeftModel

        teacher = PeftModel.from_pretrained(model, args.teacher)
        checks["teacher"] = base_checks(teacher, tokenizer, numbers=False, draw=draw)
    print(f"sham draw {draw}\n{table(checks)}")


if __name__ == "__main__":
    main()
