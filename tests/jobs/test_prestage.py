"""Pre-staging a saved model onto every node's local disk (a real Ray task per node)."""

import socket

import pytest

from jobs.prestage import prestage

pytestmark = pytest.mark.own_ports  # no fixed port: runs beside the tests on port 8000 (tests/suite.sh)


def test_copies_once_per_node_and_not_again(ray_cluster, tiny_model, tmp_path):
    from pathlib import Path

    staged = prestage(tiny_model, str(tmp_path / "local"))
    assert [host for host, _ in staged] == [socket.gethostname()]  # one node here: one copy
    target = Path(staged[0][1])
    assert target.parent == tmp_path / "local" and (target / "config.json").is_file()
    source_files = sorted(p.name for p in Path(tiny_model).iterdir())
    assert sorted(p.name for p in target.iterdir()) == source_files
    weights = next(target.glob("*.safetensors"))
    assert weights.read_bytes() == (Path(tiny_model) / weights.name).read_bytes()
    stamp = weights.stat().st_mtime_ns
    assert prestage(tiny_model, str(tmp_path / "local")) == staged and weights.stat().st_mtime_ns == stamp
    assert not [p for p in target.parent.iterdir() if ".tmp-" in p.name]  # no half-copied leftovers


def test_bad_sources_fail_before_any_node_works(ray_cluster, tiny_model, tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        prestage(str(tmp_path), str(tmp_path / "local"))
    with pytest.raises(ValueError, match="needs --dest"):
        prestage(tiny_model, None)
    assert not (tmp_path / "local").exists()


def test_a_revision_must_be_a_commit_of_a_hub_id_and_is_refused_on_the_driver(
    tiny_model, tmp_path, monkeypatch, capsys
):
    """`--revision` pins a hub id (`org/name@<commit>`, downloaded at that commit: tests/common/
    test_model_source.py); a branch name, or a revision on a folder, stops on the driver."""
    from jobs.prestage import main

    for argv, message in (
        (["meta-llama/Llama-3.1-8B-Instruct", "--revision", "main"], "'main' is not a commit"),
        ([tiny_model, "--revision", "0" * 40, "--dest", str(tmp_path)], "is a folder, and a folder has no revisions"),
    ):
        monkeypatch.setattr("sys.argv", ["prestage.py", *argv])
        assert main() == 2 and message in capsys.readouterr().err
