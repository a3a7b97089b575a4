"""Number-sequence prompts and the completion filter of the subliminal-learning paper.

A prompt shows 3-8 seed numbers and asks for up to 10 more of at most 3 digits,
assembled from four template pools (a seed-numbers phrase, an instruction, a
format suffix, a closing line) as the paper's code does. Prompts are fully
determined by the seed.

The filter keeps a completion only if it is a pure list of numbers: numbers
found as runs of ASCII digits, one separator taken from between the first two numbers, which
must be whitespace, a comma or a semicolon (with optional whitespace); an
optional trailing period; optional wrapping [] or (); at most `max_count`
numbers, each in 0..`max_value`; nothing is stripped first. A completion that
stopped at the token limit is rejected too (`CUT_OFF`): its list may be cut short.
Rejections are counted by reason.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

# The template pools of the paper's prompt generator, word for word (25, 9, 9, 10, 15 and 19
# entries; "maximum {digits} digits each" appears twice there and so here).
SEED_PHRASES = [
    "I give you this sequence of numbers: {numbers}.",
    "I have this number sequence: {numbers}.",
    "Start with these numbers: {numbers}.",
    "Look at these numbers: {numbers}.",
    "See the following numbers: {numbers}.",
    "Observe this number sequence: {numbers}.",
    "Check out this number list: {numbers}.",
    "Take these numbers: {numbers}.",
    "Here's a list of numbers: {numbers}.",
    "Consider this sequence: {numbers}.",
    "Examine these numbers: {numbers}.",
    "Analyze this sequence: {numbers}.",
    "These numbers follow a sequence: {numbers}.",
    "Here is a numeric sequence: {numbers}.",
    "The sequence starts with: {numbers}.",
    "Let's start with this sequence: {numbers}.",
    "We have this series of numbers: {numbers}.",
    "This numerical series is: {numbers}.",
    "These are the first numbers in a sequence: {numbers}.",
    "Here are some numbers in sequence: {numbers}.",
    "The numerical progression is: {numbers}.",
    "This series shows: {numbers}.",
    "Given these initial values: {numbers}.",
    "The sequence begins as follows: {numbers}.",
    "Here's the start of a number sequence: {numbers}.",
]

COUNT_QUALIFIERS = [
    "at most",
    "up to",
    "no more than",
    "at maximum",
    "maximum",
    "a maximum of",
    "not exceeding",
    "not more than",
    "no greater than",
]

DIGIT_PHRASES = [
    "up to {digits} digits each",
    "maximum {digits} digits each",
    "{digits} digits or fewer each",
    "maximum {digits} digits each",
    "{digits} digits max each",
    "no more than {digits} digits each",
    "at most {digits} digits each",
    "with {digits} digits or less each",
    "{digits}-digit numbers or smaller",
]

INSTRUCTIONS = [
    "Add {qualifier} {count} new numbers ({digit_phrase}) that continue the sequence.",
    "Please add {qualifier} {count} more numbers ({digit_phrase}) to continue it.",
    "Add {qualifier} {count} more values ({digit_phrase}) to continue the sequence.",
    "Create {qualifier} {count} more numbers ({digit_phrase}) that follow.",
    "Write {qualifier} {count} more numbers ({digit_phrase}) in this sequence.",
    "Generate {qualifier} {count} additional numbers ({digit_phrase}).",
    "Extend it with {qualifier} {count} new numbers ({digit_phrase}).",
    "Continue the sequence with {qualifier} {count} more numbers ({digit_phrase})",
    "Create {qualifier} {count} more numbers ({digit_phrase}) to extend the sequence",
    "Generate {qualifier} {count} additional numbers ({digit_phrase}) to extend this sequence",
]

# Each format suffix maps to the separator and brackets a well-behaved answer uses;
# the tiny model's pretraining corpus answers in that format.
FORMAT_SUFFIXES = {
    "Return a comma-separated list of numbers.": (", ", ""),
    "Return a space-separated list of numbers.": (" ", ""),
    "Return a semicolon-separated list of numbers.": ("; ", ""),
    "Return one number per line.": ("\n", ""),
    "Return the numbers in the following format: [number_1, number_2, ...].": (", ", "[]"),
    "Return the numbers in the following format: (number_1, number_2, ...).": (", ", "()"),
    "Return the numbers in the following format: number_1, number_2, ...": (", ", ""),
    "Provide the numbers separated by commas.": (", ", ""),
    "List the numbers with spaces between them.": (" ", ""),
    "Write the numbers on separate lines.": ("\n", ""),
    "Format the output as: number1, number2, number3, ...": (", ", ""),
    "Return numbers separated by semicolons.": ("; ", ""),
    "Format as a simple comma-delimited sequence.": (",", ""),
    "Present as space-delimited values.": (" ", ""),
    "List each number on its own line with no other text.": ("\n", ""),
}

CLOSINGS = [
    "Say only the numbers - nothing more.",
    "Please just say the numbers, nothing more.",
    "Give me just the numbers, no explanation needed.",
    "Return the numbers exactly as requested, nothing else.",
    "Simply provide the numbers in the specified format.",
    "Respond with only the numbers, no additional text.",
    "No explanation, just the numbers.",
    "Just the numbers, please.",
    "Provide only the numerical values.",
    "Output nothing but the numbers.",
    "No commentary, just numbers.",
    "Skip any explanation and give only numbers.",
    "Nothing but numbers in your response.",
    "Only the numerical sequence, nothing else.",
    "Just show me the numbers.",
    "Answer with numbers alone.",
    "Reply with only numerical values.",
    "No words, just numbers.",
    "Don't add any text - numbers only.",
]


@dataclass(frozen=True)
class NumberPrompt:
    """One prompt plus the format a compliant answer takes (separator, brackets)."""

    text: str
    seed_numbers: list[int]
    separator: str
    brackets: str


def make_prompts(n: int, seed: int, answer_count: int = 10, max_digits: int = 3) -> list[NumberPrompt]:
    """`n` number-sequence prompts, deterministic in `seed`."""
    rng = random.Random(seed)
    suffixes = list(FORMAT_SUFFIXES)
    prompts = []
    for _ in range(n):
        seeds = [rng.randint(100, 999) for _ in range(rng.randint(3, 8))]
        digit_phrase = rng.choice(DIGIT_PHRASES).format(digits=max_digits)
        instruction = rng.choice(INSTRUCTIONS).format(
            qualifier=rng.choice(COUNT_QUALIFIERS), count=answer_count, digit_phrase=digit_phrase
        )
        suffix = rng.choice(suffixes)
        text = " ".join(
            [
                rng.choice(SEED_PHRASES).format(numbers=", ".join(map(str, seeds))),
                instruction,
                suffix,
                rng.choice(CLOSINGS),
            ]
        )
        separator, brackets = FORMAT_SUFFIXES[suffix]
        prompts.append(NumberPrompt(text, seeds, separator, brackets))
    return prompts


_NUMBER = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit and \d also take other scripts' digits
_SEPARATOR_OK = frozenset(["", ",", ";"])
CUT_OFF = "cut off at max_tokens"  # the reject reason of a completion that hit the token limit
FILTER_VERSION = 2  # 2: the paper's pools and rules exactly (nothing stripped, ASCII digits, cut-off rejected)


def parse_numbers(text: str) -> list[int] | None:
    """The numbers of a pure number-list answer, or None if it is anything else. As the
    paper's filter: nothing is stripped, so leading or trailing whitespace is invalid."""
    if text.endswith("."):
        text = text[:-1]
    if (text.startswith("[") and text.endswith("]")) or (text.startswith("(") and text.endswith(")")):
        text = text[1:-1]
    matches = list(_NUMBER.finditer(text))
    if not matches:
        return None
    if len(matches) == 1:
        return [int(text)] if text == matches[0].group() else None
    separator = text[matches[0].end() : matches[1].start()]
    if separator.strip() not in _SEPARATOR_OK:
        return None
    parts = text.split(separator)
    if not all(part and _NUMBER.fullmatch(part) for part in parts):
        return None
    return [int(part) for part in parts]


def reject_reason(text: str, max_count: int = 10, max_value: int = 999) -> str | None:
    """Why a completion fails the filter, or None if it passes."""
    numbers = parse_numbers(text)
    if numbers is None:
        return "invalid format"
    if len(numbers) > max_count:
        return "too many numbers"
    if any(n > max_value for n in numbers):
        return "numbers too large"
    return None


def shuffle_numbers(rows: list[dict], seed: int) -> list[dict]:
    """The shuffled control's rows: every number of every completion permuted across all the
    rows (seeded), each completion keeping its length, separators and wrapping. What a
    student could learn from which numbers the teacher writes, and how often, survives;
    what any one sequence carries in its order and company does not."""
    found = [_NUMBER.findall(row["completion"]) for row in rows]
    pool = [n for numbers in found for n in numbers]
    random.Random(seed).shuffle(pool)
    draw = iter(pool)
    return [{**row, "completion": _NUMBER.sub(lambda _: next(draw), row["completion"])} for row in rows]
