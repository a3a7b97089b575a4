"""What a report may claim (jobs/rundir/registration.py): confirmatory only from a clean checkout,
with the preset chain tracked, no --set, and no earlier confirmatory run of the same design."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.rundir.registration import record_run, registration, source_state

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
    return registration(
        [repo / "configs" / name for name in chain], list(overrides), digest, root=repo, results=repo / "results"
    )


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
        [
            sys.executable,
            "jobs/pipeline.py",
            "--plan",
            "--set",
            "evaluate.primary_split=train",
            "--run-dir",
            "/nonexistent/plan-only",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "registration: exploratory (" in done.stdout and "--set given: evaluate.primary_split=train" in done.stdout


def test_a_key_added_to_the_code_later_keeps_a_design_a_repeat(repo):
    """A config key added since the first confirmatory run changes the preset digest; at its default
    the design is the same one (a repeat), set away from it a new one (confirmatory)."""
    design = {"name": "confirm", "replicates": 8}
    first = registration(
        [repo / "configs" / "confirm.yaml"],
        [],
        "d1",
        root=repo,
        results=repo / "results",
        design=design,
        defaults={"replicates": 1},
    )
    stored = repo / "results" / "confirm" / "first" / "report.json"
    stored.parent.mkdir(parents=True)
    stored.write_text(json.dumps({"provenance": {"registration": first, "config": {}}}))
    defaults = {"replicates": 1, "sham_teacher.kind": "matched"}

    def later(kind: str) -> str:
        now = {**design, "sham_teacher.kind": kind}
        return registration(
            [repo / "configs" / "confirm.yaml"],
            [],
            "d2",
            root=repo,
            results=repo / "results",
            design=now,
            defaults=defaults,
        )["status"]

    assert later("matched") == "repeat" and later("null1") == "confirmatory"
    # A report kept before designs were recorded is read from its provenance's config.
    first.pop("design")
    stored.write_text(
        json.dumps({"provenance": {"registration": first, "config": {"name": "confirm", "replicates": 8}}})
    )
    assert later("matched") == "repeat"


def test_the_registry_sees_every_run_and_a_resume_keeps_its_claim(repo, tmp_path):
    """A registered run's design goes in the registry before it runs: the next run of it elsewhere is
    a repeat even though no report was kept; the same directory resumed keeps its claim, and
    `--fresh` there is a new run, a repeat. Writing the tracked registry leaves the checkout clean."""
    registry = repo / "results" / "registry.jsonl"
    registry.parent.mkdir()
    registry.write_text("")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "registry")

    def run(run_dir: str, fresh: bool = False, digest: str = "d1") -> dict:
        chain = [repo / "configs" / "base.yaml", repo / "configs" / "confirm.yaml"]
        return registration(
            chain,
            [],
            digest,
            root=repo,
            results=repo / "results",
            registry=registry,
            run_dir=tmp_path / run_dir,
            fresh=fresh,
        )

    first = run("a")
    assert first["status"] == "confirmatory" and first["resumes"] is None
    record_run(first, registry)
    assert not source_state(repo)["dirty"]  # the registry's own line does not make the next run exploratory
    resumed = run("a")
    assert (
        resumed["status"] == "confirmatory"
        and resumed["resumes"].startswith("registry.jsonl line 1")
        and resumed["reasons"] == []
    )
    elsewhere = run("b")
    assert elsewhere["status"] == "repeat" and "registry.jsonl line 1" in elsewhere["earlier"]
    record_run(elsewhere, registry)
    assert run("b")["status"] == "repeat" and run("b")["resumes"].startswith("registry.jsonl line 2")
    assert run("a", fresh=True)["status"] == "repeat"  # started over: a new run of a design that ran
    assert run("c", digest="d2")["status"] == "confirmatory"  # another design is its own first
    registry.write_text(registry.read_text() + "not json\n")
    with pytest.raises(ValueError, match="line 3: not a JSON object"):
        run("c", digest="d3")


def test_a_plan_registers_nothing(tmp_path):
    """`--plan` says what the run may claim and writes no registry line (nothing ran)."""
    registry = tmp_path / "registry.jsonl"
    command = [sys.executable, "jobs/pipeline.py", "--plan", "--run-dir", str(tmp_path / "run")]
    environment = {**os.environ, "SUBLIMINAL_REGISTRY": str(registry)}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "registration: " in done.stdout and not registry.exists()


def test_a_plan_of_pairs_shows_each_pairs_run(tmp_path):
    """A preset listing teacher–sham pairs plans one run per pair, each in <run dir>/pairs/<p>. Its
    cache is an empty one: where the tiny base is built, a plan chooses each pair's sham draw on it
    (a process of its own per pair, which nothing here reads), and the suite builds the base."""
    command = [
        sys.executable,
        "jobs/pipeline.py",
        "--plan",
        "--set",
        "pairs=[1, 2]",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    environment = {**os.environ, "SUBLIMINAL_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=environment)
    assert done.returncode == 0, done.stderr[-2000:]
    # each pair's plan, at the default draw
    assert done.stdout.count("[world] the tiny base is not in the cache yet") == 2
    for pair in (1, 2):
        assert f"pair {pair} ({tmp_path / 'run' / 'pairs' / str(pair)}): " in done.stdout
    assert not (tmp_path / "run").exists()  # a plan writes nothing
