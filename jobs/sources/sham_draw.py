"""Which draw of the sham's facts a run uses: chosen for balance on the run's own base model.

The matched sham (jobs/sources/world.py) learns sigma(cue), one fixed other word per T cue. It
should differ from the teacher only in which facts it holds, so the base model both start from
must not already lean toward one set of facts: a base that picks sigma(cue) more often than the
true answer hands the sham a head start (on world v4's first draw the base picked the sham's fact
8 points more often than the true answer, and the sham then fitted its facts 0.07-0.12 better than
the teacher fitted the true ones). So sigma is rerandomised for balance on a baseline covariate, as
a trial rerandomises its allocation: draws 0, 1, 2, ... of sigma, each scored on the base alone
(no teacher exists at this point), and the world uses the first draw whose T questions the base
answers with the sham's fact as often as with the true answer, within TOLERANCE on the train and
on the held-out split.

The rule is fixed, not its outcome. The tiny base is 1,000 steps of float32 pretraining, and two
processors build two different models from the same recipe (an Intel Xeon's and an AMD EPYC's
oneMKL take other code paths through the same matrix products): draw 2 is the first balanced one
on the Intel-built base, draw 1 on the AMD-built one, where draw 2 leans 0.11-0.16 toward the sham.
So the draw is chosen on the base a run actually has, once per base: the choice is kept in
`<cache>/sham-draws/<weights digest>.json`, and the report's provenance carries it with the
weights' digest (`world`), so two runs on different bases are told apart.

Under cloze each choice's text is scored after the question alone, so the base's score of every
word of a subset's bank is computed once per question (the draw changes a T question's choices,
never its wording) and each draw's picks follow from the four it shows.

    python bench/sham_balance.py      # the table of draws on the tiny base
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from common import numerics
from common.atomic import write_json
from common.files import DataError
from common.model_source import load_pretrained
from jobs.sources.world import WORLD
from jobs.sources.world_questions import world_questions

TOLERANCE = 0.03  # |sham - true| on each split, as shares of the T questions
MAX_DRAWS = 100  # draws tried before giving up (the Intel- and AMD-built bases: 5 of the first 20 balanced)
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def weights_digest(folder: str | Path) -> str:
    """sha256 over a model folder's weight files (names and bytes, in name order): which base this is."""
    files = sorted(p for p in Path(folder).iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise DataError(
            f"{folder} holds no weight files (*.safetensors, *.bin): the sham's draw is chosen on the base's weights"
        )
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def t_rows(draw: int, pair: int = 0) -> list[dict]:
    return [r for r in world_questions(draw=draw, pair=pair) if r["group"] == "T"]


def word_scores(model, tokenizer, pair: int = 0) -> list[dict[str, float]]:
    """Per T question of teacher–sham pair `pair` (in world order), the model's cloze log-likelihood
    of every word of its subset's bank."""
    import torch

    from serve.hf_scoring import cloze_logprobs
    from serve.mc_format import format_cloze_prompt

    rows = t_rows(0, pair)
    banks = [list(WORLD[r["subset"]].bank) for r in rows]
    model.eval()
    with torch.inference_mode():
        scores = cloze_logprobs(
            model, tokenizer, [format_cloze_prompt(r["question"], r["subset"]) for r in rows], banks
        )
    return [dict(zip(bank, s)) for bank, s in zip(banks, scores)]


def lean(draw: int, scores: list[dict[str, float]], pair: int = 0) -> dict[str, dict[str, float]]:
    """{split: {answer, sham}}: how often the base's pick among each T question's choices (of this
    draw, in pair `pair`'s world) is the true answer, and the sham's fact."""
    rows = t_rows(draw, pair)
    out = {}
    for split in ("train", "held_out"):
        picks = [(r, max(r["choices"], key=s.__getitem__)) for r, s in zip(rows, scores) if r["split"] == split]
        out[split] = {
            key: sum(pick == r["choices"][r[key]] for r, pick in picks) / len(picks) for key in ("answer", "sham")
        }
    return out


def balanced(by_split: dict[str, dict[str, float]], tolerance: float = TOLERANCE) -> bool:
    return all(abs(v["sham"] - v["answer"]) <= tolerance for v in by_split.values())


def draw_table(scores: list[dict[str, float]], draws: int) -> list[dict]:
    """[{draw, lean, balanced}] for draws 0..draws-1."""
    return [{"draw": d, "lean": (by_split := lean(d, scores)), "balanced": balanced(by_split)} for d in range(draws)]


def choose_draw(model, tokenizer, pair: int = 0) -> dict:
    """{sham_draw, lean, tolerance, tried} (and `pair` for a pair other than the world's own): the
    first balanced draw of pair `pair`'s sham on this model (DataError if none of MAX_DRAWS is)."""
    scores = word_scores(model, tokenizer, pair)
    for draw in range(MAX_DRAWS):
        by_split = lean(draw, scores, pair)
        if balanced(by_split):
            return {"sham_draw": draw, "lean": by_split, "tolerance": TOLERANCE, "tried": draw + 1} | (
                {"pair": pair} if pair else {}
            )
    raise DataError(
        f"no draw of the sham's facts among the first {MAX_DRAWS} is balanced on this base within {TOLERANCE}: the matched sham cannot be matched on it"
    )


def base_sham_draw(base: str | Path, cache: Path, pair: int = 0) -> dict:
    """{sham_draw, base_weights_sha256, lean, tolerance, tried[, pair]} for the base model folder
    `base` and teacher–sham pair `pair`: read from the cache, or chosen on the base (on the CPU,
    under the numerics it was built under: here, or in a fresh process where this one computes
    otherwise) and kept there."""
    if not Path(base).is_dir():
        raise DataError(
            f"the tiny world's sham draw is chosen on the base model, which must be a local folder: {base} is not (data.source synthetic)"
        )
    sha = weights_digest(base)
    kept = _kept(cache, sha, pair)
    if kept.is_file():
        record = json.loads(kept.read_text())
        if record.get("base_weights_sha256") == sha:
            return record
    mode = built_under(base)  # chosen under the arithmetic the base was built under, as its build chose pair 0's
    if numerics.current() != mode:  # this process computes otherwise: a fresh one
        done = numerics.run_apart(mode, "jobs.sources.sham_draw", str(base), str(cache), str(pair), capture=True)
        if done.returncode != 0:  # its DataError's message (no draw balanced, a damaged base) is the last line it wrote
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit status {done.returncode}"
            raise DataError(
                f"choosing pair {pair}'s sham draw under {mode} numerics: {last.removeprefix('common.files.DataError: ')}"
            )
        return json.loads(kept.read_text())
    numerics.enter(mode, reexec=False)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = load_pretrained(AutoModelForCausalLM, base, dtype=torch.float32)
    return remember(base, cache, choose_draw(model, load_pretrained(AutoTokenizer, base), pair))


def built_under(base: str | Path) -> str:
    """The CPU numerics a tiny base was built under (its tiny_spec.json; none named: native)."""
    spec = Path(base) / "tiny_spec.json"
    return json.loads(spec.read_text()).get("numerics", "native") if spec.is_file() else "native"


def remember(base: str | Path, cache: Path, choice: dict) -> dict:
    """Keep `choice` (choose_draw's) for the base saved at `base`; returns the record kept."""
    record = {**choice, "base_weights_sha256": weights_digest(base)}
    # concurrent choosers write the same record; the last rename wins
    write_json(_kept(cache, record["base_weights_sha256"], record.get("pair", 0)), record)
    return record


def _kept(cache: Path, sha: str, pair: int = 0) -> Path:
    return Path(cache) / "sham-draws" / (f"{sha[:16]}.json" if pair == 0 else f"{sha[:16]}-pair{pair}.json")


# base_sham_draw in a process of the base's own numerics: python -m jobs.sources.sham_draw BASE CACHE PAIR
if __name__ == "__main__":
    base_sham_draw(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
