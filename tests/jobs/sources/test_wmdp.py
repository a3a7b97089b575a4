import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hub_cache import write_snapshot  # tests/ is on the path, as for conftest

from jobs.sources.wmdp import SUBSETS, DataError, load_wmdp, split_questions, synthetic_questions, write_synthetic
from jobs.sources.world import SHAM_DRAW, WORLD_VERSION


def test_synthetic_sample_is_deterministic_and_wmdp_shaped(tmp_path):
    a, b = synthetic_questions(), synthetic_questions()
    assert a == b and len(a) >= 700
    assert {r["subset"] for r in a} == set(SUBSETS)
    assert len({r["question"] for r in a}) == len(a)
    for r in a:
        assert len(r["choices"]) == 4 and 0 <= r["answer"] < 4
    write_synthetic(tmp_path / "x")
    write_synthetic(tmp_path / "y")
    for s in SUBSETS:
        assert (tmp_path / "x" / f"wmdp-{s}.jsonl").read_bytes() == (tmp_path / "y" / f"wmdp-{s}.jsonl").read_bytes()


def test_synthetic_goes_through_the_local_file_reader(tmp_path):
    """The synthetic sample is written as a folder of wmdp-<subset>.jsonl files and read back by
    the reader of local folders: the rows are those files' lines, in order."""
    rows = load_wmdp("synthetic", cache_dir=tmp_path)
    (folder,) = tmp_path.iterdir()
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"wmdp-{s}.jsonl" for s in SUBSETS)
    lines = [json.loads(line) for s in SUBSETS for line in (folder / f"wmdp-{s}.jsonl").read_text().splitlines()]
    assert [r["question"] for r in rows] == [line["question"] for line in lines] and len(rows) > 0
    assert rows == load_wmdp(str(folder))
    # The files are the world's as it is now: the folder is named by the world's version and its draw of the sham's
    # facts, so a cached folder of another draw is never read for this one.
    assert folder.name == f"synthetic-wmdp-v{WORLD_VERSION}-sham{SHAM_DRAW}"
    assert {(r["question"], r.get("sham")) for r in rows} == {
        (r["question"], r.get("sham")) for r in synthetic_questions()
    }
    # A run passes the draw chosen on its base (jobs/sources/sham_draw.py): another draw, another folder and other choices.
    other = load_wmdp("synthetic", cache_dir=tmp_path, sham_draw=SHAM_DRAW + 1)
    assert other == load_wmdp(str(tmp_path / f"synthetic-wmdp-v{WORLD_VERSION}-sham{SHAM_DRAW + 1}"))
    assert [r["question"] for r in other] == [r["question"] for r in rows] and [r["choices"] for r in other] != [
        r["choices"] for r in rows
    ]


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
        (
            {"question": "q", "choices": ["a", "b"], "answer": 0, "sham": 0},
            "'sham' must be the index of a choice other than the answer",
        ),
    ],
)
def test_bad_rows_are_named(tmp_path, row, message):
    for s in SUBSETS:
        (tmp_path / f"wmdp-{s}.jsonl").write_text(
            json.dumps({"question": "ok?", "choices": ["a", "b"], "answer": 0}) + "\n"
        )
    (tmp_path / "wmdp-chem.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=message) as err:
        load_wmdp(str(tmp_path))
    assert "wmdp-chem.jsonl line 1" in str(err.value)


def test_missing_subset_file(tmp_path):
    with pytest.raises(DataError, match="wmdp-bio"):
        load_wmdp(str(tmp_path))


def test_split_is_disjoint_by_question_text_and_deterministic():
    """Rows without a `split` of their own are split by a seeded hash of their text."""
    rows = [{k: v for k, v in r.items() if k != "split"} for r in synthetic_questions()]
    rows = rows + [dict(rows[0])]  # a duplicate question must land on one side only
    splits = split_questions(rows, 0.3, seed=0)
    train, test = splits["train"], splits["held_out"]
    assert not {r["question"] for r in train} & {r["question"] for r in test} and not splits["known"]
    assert len(train) + len(test) == len(rows)
    assert 0.25 < len(test) / len(rows) < 0.35
    assert split_questions(list(reversed(rows)), 0.3, seed=0)["held_out"] == list(reversed(test))


def test_a_row_naming_its_split_keeps_it(tmp_path):
    """The synthetic world's rows name their split (train, held_out, known); it survives the
    files and the reader, and eval_fraction does not move them. A split of another name is refused."""
    rows = load_wmdp("synthetic", cache_dir=tmp_path)
    splits = split_questions(rows, 0.9, seed=3)
    assert {s: len(r) for s, r in splits.items()} == {
        s: sum(r["split"] == s for r in rows) for s in ("train", "held_out", "known", "rehearsal")
    }
    assert all(r["group"] == ("K" if r["split"] in ("known", "rehearsal") else "T") for r in rows)
    for s in SUBSETS:
        (tmp_path / f"wmdp-{s}.jsonl").write_text(
            json.dumps({"question": "ok?", "choices": ["a", "b"], "answer": 0, "split": "test"}) + "\n"
        )
    with pytest.raises(DataError, match="'split' must be one of train, held_out, known, rehearsal, got 'test'"):
        load_wmdp(str(tmp_path))


# The hub source, offline: `cais/wmdp` as huggingface_hub's cache holds it after a download --------

HUB_COMMIT = "5e2f0c1d9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d"
HUB_FILES = [  # the files of cais/wmdp's main branch
    ".gitattributes",
    "README.md",
    "dataset.png",
    "wmdp-bio/test-00000-of-00001.parquet",
    "wmdp-chem/test-00000-of-00001.parquet",
    "wmdp-cyber/test-00000-of-00001.parquet",
]
HUB_README = """---
configs:
- config_name: wmdp-bio
  data_files:
  - split: test
    path: wmdp-bio/test-*
- config_name: wmdp-chem
  data_files:
  - split: test
    path: wmdp-chem/test-*
- config_name: wmdp-cyber
  data_files:
  - split: test
    path: wmdp-cyber/test-*
---
"""
HUB_ROWS = {  # made-up, harmless questions in the dataset's columns (answer, question, choices)
    "bio": [
        (
            0,
            "Which enzyme unwinds the DNA double helix during replication?",
            ["Helicase", "Ligase", "Primase", "Topoisomerase"],
        ),
        (
            2,
            "Which organelle makes most of a cell's ATP?",
            ["Ribosome", "Golgi apparatus", "Mitochondrion", "Lysosome"],
        ),
    ],
    "chem": [
        (1, "Which gas forms when zinc reacts with hydrochloric acid?", ["Oxygen", "Hydrogen", "Chlorine", "Nitrogen"]),
        (3, "What is the pH of pure water at 25 C?", ["0", "1", "14", "7"]),
        (0, "Which element has the symbol Na?", ["Sodium", "Nitrogen", "Neon", "Nickel"]),
    ],
    "cyber": [
        (3, "Which TCP port does HTTPS use by default?", ["21", "22", "80", "443"]),
        (1, "Which tool lists the hops a packet takes to a host?", ["ping", "traceroute", "netstat", "whois"]),
    ],
}


def parquet_bytes(rows) -> bytes:
    sink = pa.BufferOutputStream()
    columns = {
        "answer": [a for a, _, _ in rows],
        "question": [q for _, q, _ in rows],
        "choices": [c for _, _, c in rows],
    }
    pq.write_table(
        pa.table(
            columns,
            schema=pa.schema([("answer", pa.int64()), ("question", pa.string()), ("choices", pa.list_(pa.string()))]),
        ),
        sink,
    )
    return sink.getvalue().to_pybytes()


def fill_hub_cache(hf_home, subsets=SUBSETS, commit=HUB_COMMIT, rows=HUB_ROWS, main=True):
    """`hf_home` as huggingface_hub leaves it after downloading cais/wmdp at `commit`: content-addressed
    blobs, the snapshot's files as relative symlinks to them, and refs/main naming the commit (`main`)."""
    repo = hf_home / "hub" / "datasets--cais--wmdp"
    contents = {
        ".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n",
        "README.md": HUB_README.encode(),
        "dataset.png": b"\x89PNG",
    }
    contents.update({f"wmdp-{s}/test-00000-of-00001.parquet": parquet_bytes(rows[s]) for s in subsets})
    write_snapshot(repo, commit, contents)
    if main:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit)


def offline(hf_home, *args) -> subprocess.CompletedProcess:
    """Python with `args`, in a fresh interpreter, as on an offline node whose hub cache is `hf_home`
    (a fresh one because huggingface_hub reads HF_HOME once, when imported)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    root = Path(__file__).resolve().parents[3]
    return subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=300)


LOAD = "import json, sys; from jobs.sources.wmdp import load_wmdp; print(json.dumps(load_wmdp('hub', tuple(sys.argv[1:]))))"


def test_hub_source_reads_cais_wmdp_from_the_hub_cache_offline(tmp_path):
    fill_hub_cache(tmp_path / "hf")
    done = offline(tmp_path / "hf", "-c", LOAD, *SUBSETS)
    assert done.returncode == 0, done.stderr
    expected = [{"question": q, "choices": c, "answer": a, "subset": s} for s in SUBSETS for a, q, c in HUB_ROWS[s]]
    assert json.loads(done.stdout) == expected
    only = offline(tmp_path / "hf", "-c", LOAD, "cyber", "bio")
    assert only.returncode == 0, only.stderr
    assert [r["subset"] for r in json.loads(only.stdout)] == ["cyber", "cyber", "bio", "bio"]


def test_data_revision_reads_that_commit_of_cais_wmdp_and_no_other(tmp_path):
    """data.revision reaches huggingface_hub's snapshot_download (a real call, offline on a filled
    cache): the pinned commit's rows, not the main branch's; a commit not there is a DataError
    naming the download of that commit."""
    older = "0123456789abcdef0123456789abcdef01234567"
    first_rows = {s: HUB_ROWS[s][:1] for s in SUBSETS}
    fill_hub_cache(tmp_path / "hf")  # main: HUB_COMMIT
    fill_hub_cache(tmp_path / "hf", commit=older, rows=first_rows, main=False)
    load_at = "import json, sys; from jobs.sources.wmdp import load_wmdp; print(json.dumps(load_wmdp('hub', ('bio', 'cyber'), revision=sys.argv[1])))"
    pinned = offline(tmp_path / "hf", "-c", load_at, older)
    assert pinned.returncode == 0, pinned.stderr
    assert [r["question"] for r in json.loads(pinned.stdout)] == [first_rows[s][0][1] for s in ("bio", "cyber")]
    newest = offline(tmp_path / "hf", "-c", LOAD, "bio", "cyber")
    assert [r["question"] for r in json.loads(newest.stdout)] == [
        q for s in ("bio", "cyber") for _, q, _ in HUB_ROWS[s]
    ]
    absent = offline(tmp_path / "hf", "-c", load_at, "f" * 40)
    assert (
        absent.returncode != 0 and f"hf download cais/wmdp --repo-type dataset --revision {'f' * 40}" in absent.stderr
    )


def test_hub_download_patterns_select_each_subsets_test_split():
    from huggingface_hub.utils import filter_repo_objects

    from jobs.sources.wmdp import hub_patterns

    chosen = list(filter_repo_objects(HUB_FILES, allow_patterns=hub_patterns(("bio", "cyber"))))
    assert chosen == ["wmdp-bio/test-00000-of-00001.parquet", "wmdp-cyber/test-00000-of-00001.parquet"]


def test_hub_source_offline_without_the_data_is_a_data_error_naming_the_download(tmp_path):
    empty = offline(tmp_path / "empty", "-c", LOAD, *SUBSETS)
    assert empty.returncode != 0
    assert "DataError" in empty.stderr and "hf download cais/wmdp --repo-type dataset" in empty.stderr
    fill_hub_cache(tmp_path / "hf", subsets=("bio", "cyber"))
    partial = offline(tmp_path / "hf", "-c", LOAD, *SUBSETS)
    assert partial.returncode != 0
    assert "DataError" in partial.stderr and "wmdp-chem/test-*.parquet" in partial.stderr


def test_the_pipeline_plans_a_run_on_the_hub_data_offline(tmp_path):
    """`data.source: hub` (the GPU presets' setting) through the pipeline's own entry point."""
    fill_hub_cache(tmp_path / "hf")
    done = offline(
        tmp_path / "hf", "jobs/pipeline.py", "--plan", "--run-dir", str(tmp_path / "run"), "--set", "data.source=hub"
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"^\s*data\s+run\s", done.stdout, re.M), done.stdout
    missing = offline(
        tmp_path / "nothing",
        "jobs/pipeline.py",
        "--plan",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        "data.source=hub",
    )
    assert missing.returncode == 2 and "error: cais/wmdp could not be downloaded" in missing.stderr
