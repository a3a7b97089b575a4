"""Shared inputs for the benchmarks: the tiny model and number-sequence training rows."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # run as `python bench/x.py`: bench/ stays first

from jobs.sources.number_sequences import make_prompts  # noqa: E402
from jobs.sources.tiny_model import chat_prompt, ensure_tiny_model, format_numbers  # noqa: E402
from jobs.sources.wmdp import synthetic_questions  # noqa: E402


def number_rows(n: int, seed: int = 0) -> list[dict]:
    """Student-style rows: a chat-formatted number prompt and a number-list answer."""
    rng = random.Random(seed)
    rows = []
    for p in make_prompts(n, seed=seed):
        answer = [rng.randint(0, 999) for _ in range(rng.randint(5, 10))]
        rows.append({"prompt": chat_prompt(p.text), "completion": format_numbers(answer, p.separator, p.brackets)})
    return rows


def write_rows(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_model() -> str:
    return str(ensure_tiny_model())


def mc_questions(n: int, seed: int = 5) -> list[dict]:
    """`n` synthetic WMDP-format questions in /score's shape. One seed makes at most 576 distinct
    cyber questions, so larger sets join several seeds (a repeat across seeds is harmless for timing)."""
    rows: list[dict] = []
    while len(rows) < n:
        rows += synthetic_questions(n_per_subset=500, seed=seed)
        seed += 1
    return [
        {"question": r["question"], "choices": r["choices"], "answer": r["answer"], "subject": r["subset"]}
        for r in rows[:n]
    ]
