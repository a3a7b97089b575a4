"""The whole job on one GPU: every phase of the experiment, timed, and where each ran.

    python bench/gpu_job.py --out gpu_job.json                 # a CUDA machine (configs/tiny-gpu.yaml)
    python bench/gpu_job.py --config tiny-gpu --set service.engine=vllm --out gpu_job.json

Runs `python jobs/pipeline.py --config <config> --run-dir <dir> --fresh` in a child process, as a
user runs it (it starts a local Ray cluster, which finds the GPU), echoes its log and keeps it
(`--log`, default beside --out), and samples the GPUs' used memory meanwhile (NVML). From the log it
reads each phase's wall time (`[phase] N stage(s) done in Xs`) and where its work ran: every
training run ends with `..., on cuda|cpu` and every Serve application says `ready: engine E on
cuda|cpu` (its engine's /health). Prints a table and writes the JSON.

Exit status: 0 when the pipeline succeeded and every phase that trains or serves (teacher,
numbers, arms, evaluate) said it ran on cuda; 1 when the pipeline failed, a phase ran on CPU, or
a phase said nothing of where it ran (a fallback would hide there); 2 without a CUDA GPU.
On a machine without a GPU the pipeline itself refuses configs/tiny-gpu.yaml before any work.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common.atomic import write_json  # noqa: E402
from common.gpu_memory import GIB, gpu_memory  # noqa: E402

DEVICE_PHASES = ("teacher", "numbers", "arms", "evaluate")  # the phases whose work runs on a device
PHASE_START = re.compile(r"^\[(\w+)\] starting \d+ stage\(s\)")
PHASE_DONE = re.compile(r"^\[(\w+)\] \d+ stage\(s\) done in (\d+)s")
TRAINED_ON = re.compile(r"^\[(\w+)\] \S+: \d+ steps, loss .*, on (\w+)$")
SERVED_ON = re.compile(r"^\[serve\] \S+ ready: engine \w+ on (\w+)")


def phases_of(lines: list[tuple[float, str]]) -> dict:
    """{phase: {seconds, devices, started_s}} from the job log's (seconds since launch, line) pairs.
    A phase's devices are those its training runs and Serve applications named while it ran."""
    phases: dict = {}
    current = None
    for at, line in lines:
        if m := PHASE_START.match(line):
            current = m[1]
            phases.setdefault(current, {"seconds": None, "devices": [], "started_s": round(at, 1)})
        elif m := PHASE_DONE.match(line):
            phases.setdefault(m[1], {"seconds": None, "devices": [], "started_s": None})["seconds"] = float(m[2])
            current = None
        elif (m := TRAINED_ON.match(line)) and m[1] in phases:
            phases[m[1]]["devices"].append(m[2])
        elif (m := SERVED_ON.match(line)) and current is not None:
            phases[current]["devices"].append(m[1])
    for phase in phases.values():
        phase["devices"] = sorted(set(phase["devices"]))
    return phases


def off_gpu(phases: dict) -> dict[str, str]:
    """{phase: why} for each phase that trains or serves and did not run wholly on cuda."""
    why = {}
    for name in DEVICE_PHASES:
        devices = phases.get(name, {}).get("devices")
        if name not in phases:
            why[name] = "did not run"
        elif not devices:
            why[name] = "said nothing of where it ran"
        elif devices != ["cuda"]:
            why[name] = f"ran on {', '.join(devices)}"
    return why


class MemorySampler(threading.Thread):
    """The most memory used on any GPU of the machine, read every `every_s` seconds."""

    def __init__(self, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.every_s, self.peak_gib, self.stop = every_s, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for _, free, total in gpu_memory():
                self.peak_gib = max(self.peak_gib, (total - free) / GIB)
            self.stop.wait(self.every_s)


def run_pipeline(args, run_dir: Path, log_path: Path, lines: list) -> int:
    """The pipeline in a child process; its log lines, timed from launch, are appended to `lines` as
    they come (so a run cut short keeps them). Returns its exit status."""
    command = [sys.executable, "jobs/pipeline.py", "--config", args.config, "--run-dir", str(run_dir), "--fresh"]
    for assignment in args.set:
        command += ["--set", assignment]
    started = time.time()
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with open(log_path, "w") as log:
            for line in proc.stdout:
                print(line, end="", flush=True)
                log.write(line)
                log.flush()
                lines.append((time.time() - started, line.rstrip("\n")))
        return proc.wait()
    finally:
        if proc.poll() is None:  # cut short (SIGTERM from `timeout`): the pipeline tears its Serve app down on SIGTERM
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/tiny-gpu.yaml")
    parser.add_argument("--run-dir", default=None, help="default: a temporary folder")
    parser.add_argument("--set", action="append", default=[], help="key.path=value, passed to the pipeline")
    parser.add_argument("--out", default="gpu_job.json")
    parser.add_argument("--log", default=None, help="default: --out with .log")
    args = parser.parse_args()
    if not gpu_memory():
        print("error: no CUDA GPU on this machine", file=sys.stderr)
        return 2
    # `timeout` stops us so: the finally below still writes what ran
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="gpu-job-"))
    log_path = Path(args.log or Path(args.out).with_suffix(".log"))
    sampler = MemorySampler()
    sampler.start()
    started, lines, code = time.time(), [], None
    try:
        code = run_pipeline(args, run_dir, log_path, lines)
    finally:
        sampler.stop.set()
        fell_back = summarize(args, lines, code, time.time() - started, sampler.peak_gib, run_dir, log_path)
    return 1 if code != 0 or fell_back else 0


def summarize(args, lines: list, code: int | None, wall: float, peak_gib: float, run_dir: Path, log_path: Path) -> dict:
    """Write the JSON (also for a run cut short: `exit_code` null), print the table; returns off_gpu's verdict."""
    phases = phases_of(lines)
    first = min((p["started_s"] for p in phases.values() if p["started_s"] is not None), default=None)
    fell_back = off_gpu(phases)
    result = {
        "config": args.config,
        "set": args.set,
        "gpu": gpu_name(),
        "exit_code": code,
        "wall_s": round(wall, 1),
        "before_first_phase_s": first,
        "phases": phases,
        "off_gpu": fell_back,
        "peak_gpu_memory_gib": round(peak_gib, 2),
        "run_dir": str(run_dir),
        "log": str(log_path),
    }
    write_json(args.out, result)
    print(f"\n{'phase':<10} {'seconds':>8}  ran on")
    for name, phase in phases.items():
        print(
            f"{name:<10} {phase['seconds'] if phase['seconds'] is not None else '-':>8}  {', '.join(phase['devices']) or '-'}"
        )
    print(f"wall {wall:.0f} s, {first} s before the first phase, peak GPU memory {peak_gib:.1f} GiB; {args.out}")
    if code != 0:
        print(f"FAILED: the pipeline {'was cut short' if code is None else f'exited {code}'}", file=sys.stderr)
    for name, why in fell_back.items():
        print(f"FAILED: {name} {why}", file=sys.stderr)
    return fell_back


def gpu_name() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - a name is a nicety; the figures stand without it
        return None


if __name__ == "__main__":
    sys.exit(main())
