"""The default tiny base, shipped with the code and checked against its recipe.

The default base (jobs/sources/tiny_model.py, `TinySpec()`) is 1,000 steps of float32 pretraining
under pinned CPU numerics: 5-8 minutes of two cores, and the same model on any x86-64 CPU with
AVX2 (BENCHMARKS.md "One world"). Its weights and tokenizer (6.3 MB) ship in `tiny_base/` beside
this module, so a new clone's first run and every CI run start from it at once:
`ensure_tiny_model` copies them into the cache, and refuses a copy whose weights' sha256 is not
the recorded one (PINNED_BASE). Its sham draw is still chosen on this machine, on first use
(jobs/sources/sham_draw.py); the suite checks it against the recorded one.

Whether this machine builds the same model from the recipe is checked apart, from scratch (corpus,
tokenizer, pretraining; `verify_pinned_base` in jobs/sources/tiny_model.py):

    python -m jobs.sources.tiny_model --verify              # the whole build (5-8 minutes), then its sham draw
    python -m jobs.sources.tiny_model --verify --steps 25   # the first 25 optimizer steps (the suite's check)

The short check compares the tokenizer's vocabulary and merges, and the weights after the first
steps with their recorded digest: a machine whose arithmetic differs differs from the first matrix product
on. The whole build remains the proof; BENCHMARKS.md "One world" lists the machines it has run on.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from common.atomic import atomic_dir
from common.files import DataError
from jobs.sources.sham_draw import weights_digest

FOLDER = Path(__file__).with_name("tiny_base")  # the shipped copy: weights, config, tokenizer, tiny_spec.json

# The default base (TinySpec()), pinned: its cache key, its weights' sha256, the sham draw chosen
# on it, and the digest of its weights after the first `first_steps` optimizer steps of its build.
PINNED_BASE = {
    "key": "38285cc88a5b",
    "base_weights_sha256": "76790c7133e9febc60921604333342378efd4aa22faa459b11be6e2668de838e",
    "sham_draw": 21,
    "first_steps": 25,
    "first_steps_sha256": "28a0920f791d41828548818f06836d753928979ca4178fb2d36b6b5c586c9547",
}


def install(out_dir: Path, source: Path = FOLDER) -> Path:
    """Copy the shipped base into `out_dir` (written beside it, renamed into place only when its
    weights are the recorded ones: a damaged or altered copy is refused and nothing is left)."""
    with atomic_dir(out_dir) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        digest = weights_digest(tmp)
        if digest != PINNED_BASE["base_weights_sha256"]:
            raise DataError(
                f"the shipped tiny base {source} has weights sha256 {digest}, not the recorded "
                f"{PINNED_BASE['base_weights_sha256']}: the copy is damaged; restore it from git "
                "(`git checkout -- jobs/sources/tiny_base`), or delete the folder to build the base from its recipe"
            )
    print(f"tiny model: the pinned base (weights sha256 {digest[:16]}..., as recorded) copied from {source}: {out_dir}")
    return out_dir


def tokenizer_rules(folder: Path) -> dict:
    """A saved tokenizer's vocabulary, merges, special tokens and templates: tokenizer.json without
    the padding and truncation settings its last user left (the build's sham draw pads on the left)."""
    rules = json.loads((folder / "tokenizer.json").read_text())
    return {k: v for k, v in rules.items() if k not in ("padding", "truncation")}
