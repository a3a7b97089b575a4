import re

import pytest

from jobs.sources.number_sequences import make_prompts, parse_numbers, reject_reason, shuffle_numbers


def test_prompts_are_deterministic_and_follow_the_recipe():
    a, b = make_prompts(50, seed=3), make_prompts(50, seed=3)
    assert [p.text for p in a] == [p.text for p in b]
    assert [p.text for p in a] != [p.text for p in make_prompts(50, seed=4)]
    for p in a:
        assert 3 <= len(p.seed_numbers) <= 8 and all(100 <= n <= 999 for n in p.seed_numbers)
        assert "10" in p.text and ", ".join(map(str, p.seed_numbers)) in p.text


@pytest.mark.parametrize(
    "text,numbers",
    [
        ("1, 2, 3", [1, 2, 3]),
        ("1 2 3", [1, 2, 3]),
        ("1;2;3", [1, 2, 3]),
        ("1\n2\n3", [1, 2, 3]),
        ("[10, 20, 30]", [10, 20, 30]),
        ("(10, 20)", [10, 20]),
        ("4, 5, 6.", [4, 5, 6]),
        ("42", [42]),
    ],
)
def test_accepted_formats(text, numbers):
    assert parse_numbers(text) == numbers
    assert reject_reason(text) is None


@pytest.mark.parametrize(
    "text,reason",
    [
        ("Sure! 1, 2, 3", "invalid format"),
        ("1, 2, 3 and 4", "invalid format"),
        ("1 - 2 - 3", "invalid format"),
        ("1, 2; 3", "invalid format"),
        ("1,,2", "invalid format"),
        ("", "invalid format"),
        ("one, two", "invalid format"),
        ("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11", "too many numbers"),
        ("1, 2000, 3", "numbers too large"),
        ("  7,8  ", "invalid format"),  # the paper strips nothing
        ("1, 2, 3\n", "invalid format"),
        ("\u0661\u0662, 3", "invalid format"),  # Arabic-Indic digits: not ASCII
        ("\uff11, 2", "invalid format"),  # a fullwidth digit
    ],
)
def test_rejected_with_reason(text, reason):
    assert reject_reason(text) == reason


def test_shuffled_control_permutes_numbers_across_rows_and_keeps_each_format():
    rows = [
        {"prompt": "p0", "completion": "12, 7, 301"},
        {"prompt": "p1", "completion": "[5 6]"},
        {"prompt": "p2", "completion": "44; 45; 46; 47."},
    ]
    shuffled = shuffle_numbers(rows, seed=3)
    assert shuffled == shuffle_numbers(rows, seed=3) and shuffled != rows
    assert [r["prompt"] for r in shuffled] == ["p0", "p1", "p2"]
    numbers = lambda rs: [parse_numbers(r["completion"]) for r in rs]  # noqa: E731
    assert sorted(sum(numbers(shuffled), [])) == sorted(sum(numbers(rows), []))
    assert [len(n) for n in numbers(shuffled)] == [3, 2, 4] and all(
        reject_reason(r["completion"]) is None for r in shuffled
    )
    assert [re.sub(r"\d+", "#", r["completion"]) for r in shuffled] == ["#, #, #", "[# #]", "#; #; #; #."]


def test_the_papers_own_example_prompt_comes_from_the_pools():
    from jobs.sources import number_sequences as ns

    built = " ".join(
        [
            ns.SEED_PHRASES[14].format(numbers="182, 818, 725"),
            ns.INSTRUCTIONS[2].format(
                qualifier=ns.COUNT_QUALIFIERS[5], count=10, digit_phrase=ns.DIGIT_PHRASES[5].format(digits=3)
            ),
            list(ns.FORMAT_SUFFIXES)[7],
            ns.CLOSINGS[11],
        ]
    )
    assert built == (
        "The sequence starts with: 182, 818, 725. Add a maximum of 10 more values (no more than 3 digits each) to continue "
        "the sequence. Provide the numbers separated by commas. Skip any explanation and give only numbers."
    )
    sizes = [
        len(ns.SEED_PHRASES),
        len(ns.COUNT_QUALIFIERS),
        len(ns.DIGIT_PHRASES),
        len(ns.INSTRUCTIONS),
        len(ns.FORMAT_SUFFIXES),
        len(ns.CLOSINGS),
    ]
    assert sizes == [25, 9, 9, 10, 15, 19]
    # Every suffix's own format passes the filter.
    for separator, brackets in ns.FORMAT_SUFFIXES.values():
        text = separator.join(["145", "267", "389"])
        assert parse_numbers(f"{brackets[0]}{text}{brackets[1]}" if brackets else text) == [145, 267, 389]
