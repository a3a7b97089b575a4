"""Atomic writes: a reader never sees half a file, and a failed write leaves nothing that looks finished."""

import json
import os

import pytest

from common.atomic import TMP_MARK, atomic_dir, atomic_file, write_json, write_jsonl, write_text
from common.files import file_digest


def leftovers(folder):
    return [p.name for p in folder.rglob("*") if TMP_MARK in p.name]


def test_whole_file_writers(tmp_path):
    write_text(tmp_path / "a" / "b.md", "héllo\n")  # parents are created; UTF-8
    assert (tmp_path / "a" / "b.md").read_text(encoding="utf-8") == "héllo\n"
    write_json(tmp_path / "m.json", {"path": tmp_path, "n": 1})
    assert json.loads((tmp_path / "m.json").read_text()) == {"path": str(tmp_path), "n": 1}
    rows = [{"i": i, "s": "x" * i} for i in range(5)]
    digest = write_jsonl(tmp_path / "rows.jsonl", (r for r in rows))  # a generator streams
    assert [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()] == rows
    assert digest == file_digest(tmp_path / "rows.jsonl")  # what the manifest would record
    assert leftovers(tmp_path) == []


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_jsonl(path, [{"old": True}])

    def rows():
        yield {"new": 1}
        raise RuntimeError("crash mid-write")

    with pytest.raises(RuntimeError):
        write_jsonl(path, rows())
    assert path.read_text() == '{"old": true}\n' and leftovers(tmp_path) == []
    with pytest.raises(TypeError):  # a row JSON cannot hold
        write_jsonl(tmp_path / "x.jsonl", [{"s": {1}}])
    assert not (tmp_path / "x.jsonl").exists() and leftovers(tmp_path) == []


def test_atomic_file_replaces_in_one_step(tmp_path):
    link = tmp_path / "current"
    for name in ("v1", "v2"):
        with atomic_file(link) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(".current" + TMP_MARK)
            tmp.symlink_to(name)
        assert os.readlink(link) == name
    with pytest.raises(ValueError), atomic_file(link) as tmp:
        tmp.write_text("half")
        raise ValueError
    assert os.readlink(link) == "v2" and leftovers(tmp_path) == []


def test_atomic_dir_appears_only_when_complete(tmp_path):
    target = tmp_path / "sub" / "model"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "weights").write_text("half")
        assert not target.exists()
        raise RuntimeError("crash")
    assert not target.exists() and leftovers(tmp_path) == []

    with atomic_dir(target) as tmp:
        assert tmp.is_dir() and not any(tmp.iterdir())
        (tmp / "config.json").write_text("{}")
    assert (target / "config.json").is_file() and leftovers(tmp_path) == []


def test_atomic_dir_replacing(tmp_path):
    target = tmp_path / "out"
    target.mkdir()  # an empty folder is replaced
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(FileExistsError), atomic_dir(target) as tmp:  # a finished one is not, unless asked
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["a"] and leftovers(tmp_path) == []
    with atomic_dir(target, replace=True) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b"] and leftovers(tmp_path) == []
