"""Pinned CPU numerics: the same float results from the same code on any x86-64 CPU with AVX2.

Float arithmetic on a CPU depends on the vector width and the library code path the machine
picks: the tiny base built on an Intel Xeon and on an AMD EPYC (AVX-512) were two different
models, with two different sham draws. So the tiny base is always built pinned (and its sham
draws chosen so): one world on every machine. A run computes pinned where it opts in
(`numerics: reproducible`, as a registered preset does); the default stays `native`, since pinned
costs 47% on the default run (173 s native, 254 s pinned on one quiet AMD EPYC, BENCHMARKS.md),
over the 25% a default may cost. Under `reproducible` every process the job starts computes as a
plain AVX2 machine would:

- torch's own kernels (reductions, softmax, AdamW) at AVX2 width: `ATEN_CPU_CAPABILITY=avx2`;
- oneDNN's kernels likewise: `ONEDNN_MAX_CPU_ISA=AVX2`;
- oneMKL, which does torch's float32 matrix products on x86 (sgemm; `MKL_VERBOSE=1` shows it), on
  its processor-independent branch: `MKL_CBWR=COMPATIBLE`, the one branch oneMKL honours on AMD
  processors as well as Intel's (it is slower than the native branch on both);
- the thread count asked is the one used: `MKL_DYNAMIC=FALSE`, `OMP_DYNAMIC=FALSE`; a process that
  sets its own (the driver, the tiny model's build) uses THREADS intra-op threads on every machine,
  a Ray worker the CPUs its task or actor holds (Ray sets `OMP_NUM_THREADS` from them: the preset's,
  not the machine's). oneMKL reproduces a result only at a fixed thread count.

Every cap is needed (measured on one AMD EPYC, the tiny base's weights: native, capped at AVX2 and
capped at AVX-512 under COMPATIBLE gave three different models). The variables are read when the
libraries load, so they are set before torch is imported: by `pin` at the top of the pipeline's
driver (which runs itself again under the preset's mode when torch is already loaded under another,
`enter`), through the job's runtime env (Ray Train workers, Serve replicas, tasks: `ray_env_vars`)
and its worker set-up hook, and in the tiny model's build (a fresh process when the caller's torch
is not loaded under the build's mode). `native` leaves every library to pick its own path, as
before. GPU arithmetic is not pinned by any of this.

This module imports nothing heavy (the worker set-up hook calls it before anything else loads).
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

ENV = "SUBLIMINAL_NUMERICS"  # the mode a process runs under, set by whoever started it (and by `pin`)
MODES = ("reproducible", "native")
DEFAULT = "native"  # a run's mode; reproducible costs 1.47x on the default run (BENCHMARKS.md), so it is opted into
THREADS = 2  # intra-op threads of a pinned process that sets its own (the driver, the tiny model's build)
PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "COMPATIBLE",
    "MKL_DYNAMIC": "FALSE",
    "OMP_DYNAMIC": "FALSE",
}


class NumericsError(ValueError):
    """A mode that is not one, or an environment that contradicts the mode asked for."""


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise NumericsError(f"numerics: {mode!r} is not a mode ({', '.join(MODES)})")
    return mode


def environ(mode: str, base: dict | None = None) -> dict[str, str]:
    """An environment (`base`, default this process's) set for `mode`: under `reproducible` the
    variables of PINNED added (one `base` already sets to something else is an error naming it);
    under `native` those at their pinned values removed, as a pinned parent leaves them; and the
    mode itself (ENV), which children inherit."""
    env = dict(os.environ if base is None else base)
    if check_mode(mode) == "reproducible":
        clash = {k: env[k] for k, v in PINNED.items() if env.get(k, v) != v}
        if clash:
            given = ", ".join(f"{k}={v}" for k, v in clash.items())
            raise NumericsError(
                f"numerics reproducible sets {', '.join(f'{k}={PINNED[k]}' for k in clash)}, and the environment has {given}: unset it, or use numerics native"
            )
        env.update(PINNED)
    else:
        env = {k: v for k, v in env.items() if PINNED.get(k) != v}
    return env | {ENV: mode}


def pin(mode: str) -> None:
    """Set this process's environment for `mode` (`environ`), before torch loads so that its
    libraries read it."""
    env = environ(mode)
    for name in set(os.environ) - set(env):
        del os.environ[name]
    os.environ.update(env)


def loaded() -> str | None:
    """The mode this process's torch runs under: None before torch is imported; `reproducible` when
    the process was pinned before torch loaded (its kernels at AVX2 width or below), else `native`."""
    if "torch" not in sys.modules:
        return None
    import torch

    pinned = os.environ.get(ENV) == "reproducible" and all(os.environ.get(k) == v for k, v in PINNED.items())
    return "reproducible" if pinned and torch.backends.cpu.get_cpu_capability() != "AVX512" else "native"


def current() -> str:
    """The mode this process computes under: its torch's once loaded, else the one its environment
    names (the default where none is named)."""
    return loaded() or os.environ.get(ENV, DEFAULT)


def run_apart(mode: str, module: str, *args: str, capture: bool = False):
    """`python -m module args` in a fresh process set up for `mode` before its torch loads (this
    checkout importable), for work that must compute under a mode its caller does not; returns the
    finished process (its stderr as text with `capture`, its stdout then dropped)."""
    import subprocess

    root = str(Path(__file__).resolve().parents[1])
    env = environ(mode) | {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    output = {"stdout": subprocess.DEVNULL, "stderr": subprocess.PIPE, "text": True} if capture else {}
    return subprocess.run([sys.executable, "-m", module, *args], env=env, check=not capture, **output)


def threads(mode: str) -> int:
    """Intra-op threads of a process that sets its own: THREADS pinned, every CPU native."""
    return THREADS if check_mode(mode) == "reproducible" else max(1, os.cpu_count() or 1)


def enter(mode: str, reexec: bool) -> None:
    """Make this process compute under `mode`, its torch threads set. Before torch loads the
    environment is set here; once torch is loaded under another mode the process runs its own
    command again under `mode` (`reexec`, a command line's own process), or it is an error."""
    now = loaded()
    if now is None:
        pin(mode)
    elif now != mode:
        if not reexec:
            raise NumericsError(
                f"numerics {mode}: this process's torch is already loaded under {now}; run it as its own command"
            )
        pin(mode)
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    import torch

    torch.set_num_threads(threads(mode))


def ray_env_vars(mode: str, taken: set[str] = frozenset()) -> dict[str, str]:
    """What a job's runtime env carries to every process Ray starts for it (workers, replicas,
    tasks): the mode, and under `reproducible` the variables of PINNED, but those in `taken` (the
    job's own runtime env sets them; Ray refuses a key set twice, and `pin` checked their values)."""
    env = {ENV: check_mode(mode), **(PINNED if mode == "reproducible" else {})}
    return {k: v for k, v in env.items() if k not in taken}


def setup_worker() -> None:
    """In a Ray worker process (the job's `worker_process_setup_hook`), before its code imports
    torch: the mode the job's runtime env names, applied (a worker outside such a job: nothing)."""
    if os.environ.get(ENV) in MODES:
        pin(os.environ[ENV])


def cpu() -> dict[str, str]:
    """{model, vector_width}: this machine's CPU and its widest vector unit (AVX-512, AVX2, or
    what it is otherwise), read from /proc/cpuinfo where there is one."""
    model, flags = platform.processor() or platform.machine(), set()
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
            if flags and model:
                break
    width = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else f"no AVX2 ({platform.machine()})"
    return {"model": model, "vector_width": width}


def describe(mode: str) -> dict:
    """What a report's provenance records: the mode, the CPU and its vector width, the threads a
    self-set process uses, and (pinned) the variables set."""
    out = {"mode": check_mode(mode), "cpu": cpu(), "threads": threads(mode)}
    return out | ({"variables": dict(PINNED)} if mode == "reproducible" else {})


def log_line(mode: str) -> str:
    """One line for a job log's start: the mode and the machine."""
    found = cpu()
    if mode == "native":
        return f"[numerics] native: {found['model']} ({found['vector_width']}), every library on its own path, {threads(mode)} threads"
    warn = (
        ""
        if found["vector_width"] in ("AVX-512", "AVX2")
        else ": this CPU has no AVX2, so its numbers are not those of an AVX2 machine"
    )
    return f"[numerics] reproducible: {found['model']} ({found['vector_width']}) held to AVX2, MKL_CBWR=COMPATIBLE, {THREADS} threads{warn}"
