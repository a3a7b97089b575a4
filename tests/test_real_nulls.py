"""bench/real_nulls.py: every split of k trained-alike replicates into two halves, each once."""

import sys
from itertools import chain
from math import comb
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from real_nulls import halves  # noqa: E402


def test_halves_are_every_unordered_split_into_two_halves_once():
    for k in (6, 8):
        splits = halves(k)
        assert len(splits) == comb(k, k // 2) // 2  # 10 for 6, 35 for 8
        assert all(sorted(chain(a, b)) == list(range(k)) and len(a) == len(b) == k // 2 for a, b in splits)
        # no split twice, either way round
        assert len({frozenset((frozenset(a), frozenset(b))) for a, b in splits}) == len(splits)
