"""What a report may claim (jobs/rundir/registration.py): confirmatory only from a clean checkout,
with the preset chain tracked, no --set, and no earlier confirmatory run of the same design."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.rundir.registration import registration, source_state

ROOT = Path(__file__).resolve().parents[3]


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A git repository holding a preset that extends another, committed."""
    root = tmp_path / "repo"
    (root / "configs").mkdir(parents=True)
    (root / "configs" / "base.yaml").write_text("name: base\n")
    (root / "configs" / "confirm.yaml").write_text("extends: base.yaml\nname: confirm\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "presets")
    return root


def claim(repo: Path, overrides=(), digest="d1", chain=("base.yaml", "confirm.yaml")) -> dict:
    return registration([repo / "configs" / name for name in chain], list(overrides), digest, root=repo, results=repo / "results")


def test_a_clean_committed_design_is_confirmatory_once_then_a_repeat(repo):
    first = claim(repo)
    assert first["status"] == "confirmatory" and first["reasons"] == [] and not first["dirty"]
    assert first["commit"] == source_state(repo)["commit"] and len(first["commit"]) == 40
    stored = repo / "results" / "confirm" / "2026-11-27-abc" / "report.json"
    stored.parent.mkdir(parents=True)
    stored.write_text(json.dumps({"provenance": {"registration": first}}))
    again = claim(repo)
    assert again["status"] == "repeat" and again["earlier"] == str(stored)
    assert claim(repo, digest="d2")["status"] == "confirmatory"  # another design is its own first


def test_a_set_on_a_primary_key_makes_it_exploratory(repo):
    out = claim(repo, ["evaluate.primary_split=held_out"])
    assert out["status"] == "exploratory" and "--set given: evaluate.primary_split=held_out" in out["reasons"]


def test_a_modified_or_untracked_preset_makes_it_exploratory(repo):
    (repo / "configs" / "mine.yaml").write_text("extends: base.yaml\n")
    untracked = claim(repo, chain=("base.yaml", "mine.yaml"))
    assert untracked["status"] == "exploratory" and "mine.yaml" in untracked["reasons"][0]
    (repo / "configs" / "base.yaml").write_text("name: base\nreplicates: 9\n")  # a parent edited after the commit
    edited = claim(repo)
    assert edited["status"] == "exploratory" and edited["dirty"] and "modified" in edited["reasons"][0]


def test_outside_a_checkout_nothing_is_confirmatory(tmp_path):
    (tmp_path / "p.yaml").write_text("name: p\n")
    out = registration([tmp_path / "p.yaml"], [], "d", root=tmp_path, results=tmp_path / "results")
    assert out["status"] == "exploratory" and out["commit"] is None and "git checkout" in out["reasons"][0]


def test_the_pipeline_says_what_its_run_may_claim_before_it_runs():
    done = subprocess.run(
        [sys.executable, "jobs/pipeline.py", "--plan", "--set", "evaluate.primary_split=train", "--run-dir", "/nonexistent/plan-only"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "registration: exploratory (" in done.stdout and "--set given: evaluate.primary_split=train" in done.stdout


def test_a_key_added_to_the_code_later_keeps_a_design_a_repeat(repo):
    """A config key added since the first confirmatory run changes the preset digest; at its default
    the design is the same one (a repeat), set away from it a new one (confirmatory)."""
    design = {"name": "confirm", "replicates": 8}
    first = registration([repo / "configs" / "confirm.yaml"], [], "d1", root=repo, results=repo / "results", design=design, defaults={"replicates": 1})
    stored = repo / "results" / "confirm" / "first" / "report.json"
    stored.parent.mkdir(parents=True)
    stored.write_text(json.dumps({"provenance": {"registration": first, "config": {}}}))
    defaults = {"replicates": 1, "sham_teacher.kind": "matched"}

    def later(kind: str) -> str:
        now = {**design, "sham_teacher.kind": kind}
        return registration([repo / "configs" / "confirm.yaml"], [], "d2", root=repo, results=repo / "results", design=now, defaults=defaults)["status"]

    assert later("matched") == "repeat" and later("null1") == "confirmatory"
    # A report kept before designs were recorded is read from its provenance's config.
    first.pop("design")
    stored.write_text(json.dumps({"provenance": {"registration": first, "config": {"name": "confirm", "replicates": 8}}}))
    assert later("matched") == "repeat"
