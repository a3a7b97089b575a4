import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.wmdp import DataError, SUBSETS, load_wmdp, split_questions, synthetic_questions, write_synthetic


def test_synthetic_sample_is_deterministic_and_wmdp_shaped(tmp_path):
    a, b = synthetic_questions(), synthetic_questions()
    assert a == b and len(a) >= 1000
    assert {r["subset"] for r in a} == set(SUBSETS)
    assert len({r["question"] for r in a}) == len(a)
    for r in a:
        assert len(r["choices"]) == 4 and 0 <= r["answer"] < 4
    write_synthetic(tmp_path / "x")
    write_synthetic(tmp_path / "y")
    for s in SUBSETS:
        assert (tmp_path / "x" / f"wmdp-{s}.jsonl").read_bytes() == (tmp_path / "y" / f"wmdp-{s}.jsonl").read_bytes()


def test_synthetic_goes_through_the_local_file_reader(tmp_path):
    rows = load_wmdp("synthetic", cache_dir=tmp_path)
    assert rows == load_wmdp(str(next(tmp_path.iterdir())))


def test_local_parquet_in_the_hub_layout(tmp_path):
    for s in SUBSETS:
        (tmp_path / f"wmdp-{s}").mkdir()
        table = pa.table({"question": [f"{s} q?"], "choices": [["a", "b", "c"]], "answer": [2]})
        pq.write_table(table, tmp_path / f"wmdp-{s}" / "test-00000-of-00001.parquet")
    rows = load_wmdp(str(tmp_path))
    assert [r["subset"] for r in rows] == list(SUBSETS)
    assert rows[0] == {"question": "bio q?", "choices": ["a", "b", "c"], "answer": 2, "subset": "bio"}


@pytest.mark.parametrize(
    "row,message",
    [
        ({"question": "q", "choices": ["a", "b"]}, "missing field 'answer'"),
        ({"question": "q", "choices": ["a"], "answer": 0}, "2..26"),
        ({"question": "q", "choices": ["a", "b"], "answer": 5}, "out of range"),
        ({"question": "", "choices": ["a", "b"], "answer": 0}, "question"),
    ],
)
def test_bad_rows_are_named(tmp_path, row, message):
    for s in SUBSETS:
        (tmp_path / f"wmdp-{s}.jsonl").write_text(json.dumps({"question": "ok?", "choices": ["a", "b"], "answer": 0}) + "\n")
    (tmp_path / "wmdp-chem.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=message) as err:
        load_wmdp(str(tmp_path))
    assert "wmdp-chem.jsonl line 1" in str(err.value)


def test_missing_subset_file(tmp_path):
    with pytest.raises(DataError, match="wmdp-bio"):
        load_wmdp(str(tmp_path))


def test_split_is_disjoint_by_question_text_and_deterministic():
    rows = synthetic_questions()
    rows = rows + [dict(rows[0])]  # a duplicate question must land on one side only
    train, test = split_questions(rows, 0.3, seed=0)
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert len(train) + len(test) == len(rows)
    assert 0.25 < len(test) / len(rows) < 0.35
    assert split_questions(list(reversed(rows)), 0.3, seed=0)[1] == list(reversed(test))
