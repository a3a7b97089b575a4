"""`left_truncate` ends on every prompt: the cut of a prompt holding characters that a byte-level BPE
splits into several tokens (4-byte characters, CJK, combining marks, emoji sequences), at every
room from the prompt's full length down. Before the fix a cut falling inside the first character
kept the text unchanged and looped forever on the replica's one preparation thread.

The tokenizer is the tiny model's own (trained on its corpus in about a second, no model built).
Each call runs under a budget of tokenizer calls instead of a clock: a loop that makes no progress
spends it at once, and a deterministic bound cannot flake on a busy machine.
"""

from __future__ import annotations

import pytest

from serve.mc_format import format_mc_prompt, left_truncate

CHARACTERS = {
    "4-byte hieroglyph": "\U00013000",
    "emoji": "\U0001f600",
    "CJK pair": "\u4e2d\u6587",
    "combining mark": "e\u0301",
    "emoji ZWJ sequence": "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "2-byte letter": "\u00e9",
}
CALL_BUDGET = 12  # the first count and two per step: a step that makes progress ends the loop in one to three


class BudgetExceeded(AssertionError):
    pass


class Budgeted:
    """The tokenizer, refusing its (CALL_BUDGET + 1)th call: a left_truncate stuck in its loop stops here."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls > CALL_BUDGET:
            raise BudgetExceeded(f"left_truncate made {CALL_BUDGET} tokenizer calls without finishing")
        return self.tokenizer(*args, **kwargs)


@pytest.fixture(scope="module")
def tokenizer():
    from jobs.sources.tiny_model import TinySpec, synthetic_corpus, train_tokenizer

    spec = TinySpec()
    return train_tokenizer([prompt + completion for prompt, completion in synthetic_corpus(spec)], spec)


def test_the_reported_prompt_ends_at_the_rooms_that_hung(tokenizer):
    """The issue's reproduction: this prompt cut to 250 or 251 tokens never returned."""
    prompt = "a " * 300 + "\U00013000" + " b" * 247
    for room in (252, 251, 250):
        cut, lost, kept = left_truncate(Budgeted(tokenizer), prompt, room)
        assert prompt.endswith(cut) and kept == len(tokenizer(cut).input_ids) <= room and lost > 0


@pytest.mark.parametrize("name", CHARACTERS)
def test_every_room_ends_with_a_suffix_that_fits(tokenizer, name):
    """At every room until the context cannot hold any of the prompt: the result is a suffix of the
    prompt (a cut between characters), fits the room, counts what it lost, and loses no more than
    one character's byte tokens (at most 4) and one merge at the new edge below the room."""
    character = CHARACTERS[name]
    question = " ".join(f"{character}word{i}{character}" for i in range(40)) + f" which {character}?"
    prompt = format_mc_prompt(question, [f"{character}one", "two", f"three{character}", "four"], "cyber")
    full = len(tokenizer(prompt).input_ids)
    rooms_cut = 0
    for room in range(full, 0, -1):
        try:
            cut, lost, kept = left_truncate(Budgeted(tokenizer), prompt, room)
        except ValueError as error:  # the room holds none of the prompt: refused, by name
            assert "cannot hold any of this prompt" in str(error)
            break
        assert prompt.endswith(cut), f"room {room}: not a suffix"
        assert kept == len(tokenizer(cut).input_ids) <= room and lost == full - kept
        assert room - kept <= 5, f"room {room}: {room - kept} tokens below the room"
        rooms_cut += 1
    assert rooms_cut > full // 2  # most rooms were cut, not refused
