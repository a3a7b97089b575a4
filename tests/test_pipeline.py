"""The main job, run as a user runs it: `python jobs/pipeline.py` in a subprocess (its own local Ray).

One reduced tiny run is stopped (SIGTERM, what `ray job stop` sends) during the
student stage, then rerun: the rerun must skip the finished stages, leave their
outputs untouched, and complete the report.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REDUCED = ["--set", "numbers.prompts=384", "--set", "numbers.keep=192"]
MODELS = {"base", "teacher", "student", "control"}


def command(*args) -> list[str]:
    return [sys.executable, "jobs/pipeline.py", *args]


def run_pipeline(*args, cache_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "SUBLIMINAL_CACHE": str(cache_dir)}
    return subprocess.run(command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


HUB_TOKEN = "hf_never_written_anywhere_0123456789"


def stop_during_student_stage(run_dir: Path, cache_dir) -> str:
    env = {**os.environ, "SUBLIMINAL_CACHE": str(cache_dir), "HF_TOKEN": HUB_TOKEN}
    proc = subprocess.Popen(command("--run-dir", str(run_dir), *REDUCED), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = []
    for line in proc.stdout:
        log.append(line)
        if line.startswith("[student] starting"):
            time.sleep(8)  # let the student's Ray Train run get going
            proc.send_signal(signal.SIGTERM)
            break
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0, "".join(log[-40:])
    return "".join(log)


@pytest.mark.timeout(1500)
def test_pipeline_end_to_end_stopped_and_resumed(tmp_path, tiny_model, cache_dir):
    run_dir = tmp_path / "run"
    first_log = stop_during_student_stage(run_dir, cache_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert set(manifest["stages"]) == {"data", "teacher", "numbers"}, first_log[-3000:]
    kept_files = [run_dir / "teacher" / "adapter" / "adapter_model.safetensors", run_dir / "numbers" / "teacher.jsonl",
                  run_dir / "numbers" / "control.jsonl", run_dir / "data" / "held_out.jsonl"]  # fmt: skip
    before = {path: path.stat().st_mtime_ns for path in kept_files}

    done = run_pipeline("--run-dir", str(run_dir), *REDUCED, cache_dir=cache_dir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for stage in ("data", "teacher", "numbers"):
        assert f"[{stage}] finished earlier with the same inputs: skipped" in done.stdout
    assert {path: path.stat().st_mtime_ns for path in kept_files} == before

    report = json.loads((run_dir / "report.json").read_text())
    assert set(report["models"]) == MODELS
    for m in report["models"].values():
        assert set(m["accuracy"]) == {"overall", "bio", "chem", "cyber"} and m["n"] > 300
        assert m["ci95"][0] <= m["accuracy"]["overall"] <= m["ci95"][1]
    # The target: a LoRA on the train split gains at least 15 points held out.
    assert report["models"]["teacher"]["accuracy"]["overall"] - report["models"]["base"]["accuracy"]["overall"] >= 0.15
    assert 0 < report["numbers"]["teacher"]["kept"] == report["numbers"]["control"]["kept"] <= 192  # equal training sets
    for source in ("teacher", "control"):
        numbers = report["numbers"][source]
        assert numbers["generated"] >= numbers["kept"] + sum(numbers["rejected"].values())
        assert len((run_dir / "numbers" / f"{source}.jsonl").read_text().splitlines()) == numbers["kept"]
    transfer = report["transfer"]
    assert transfer["ci95"][0] <= transfer["value"] <= transfer["ci95"][1]
    assert transfer["value"] == pytest.approx(transfer["student_teacher_agreement"] - transfer["control_teacher_agreement"])
    assert {"data", "teacher", "numbers", "student", "control", "evaluate"} <= set(report["timings"])
    assert report["provenance"]["git_commit"] and report["provenance"]["seeds"] and "torch" in report["provenance"]["packages"]
    assert (run_dir / "report.md").read_text().count("|") > 20 and (run_dir / "accuracy.png").stat().st_size > 1000
    # A hub token in the job's environment never reaches the run directory.
    assert not [p for p in run_dir.rglob("*") if p.is_file() and HUB_TOKEN.encode() in p.read_bytes()]

    rows = [json.loads(line) for line in (run_dir / "eval" / "student.jsonl").read_text().splitlines()]
    assert len(rows) == report["models"]["student"]["n"]
    assert {"question", "choices", "subset", "answer", "prediction", "logprobs"} <= set(rows[0])
    teacher_data = (run_dir / "data" / "teacher_train.jsonl").read_text()
    assert not [r["question"] for r in rows if json.dumps(r["question"])[1:-1] in teacher_data]

    # The same run directory with another config is refused, naming the key, and loses nothing.
    refused = run_pipeline("--run-dir", str(run_dir), *REDUCED, "--set", "numbers.keep=64", cache_dir=cache_dir)
    assert refused.returncode == 2 and "numbers.keep" in refused.stderr and "--fresh" in refused.stderr
    assert (run_dir / "report.json").is_file()


def test_bad_input_stops_with_a_clear_message(tmp_path, cache_dir):
    done = run_pipeline("--run-dir", str(tmp_path / "a"), "--set", "teacher.lerning_rate=1", cache_dir=cache_dir)
    assert done.returncode == 2 and "teacher.lerning_rate" in done.stderr
    done = run_pipeline("--config", str(tmp_path / "missing.yaml"), cache_dir=cache_dir)
    assert done.returncode == 2 and "missing.yaml" in done.stderr
    # A preset that cannot fit this (CPU) cluster stops before any work: not even its run directory is made.
    done = run_pipeline("--config", "configs/llama-70b-qlora.yaml", "--run-dir", str(tmp_path / "big"), cache_dir=cache_dir)
    assert done.returncode == 2 and "teacher.quantization=4bit needs a CUDA GPU" in done.stderr
    assert "8 GPU workers need 8 GPUs; the cluster can have 0" in done.stderr and not (tmp_path / "big").exists()
    done = run_pipeline("--run-dir", str(tmp_path / "b"), "--set", f"model.path={tmp_path / 'no-model'}", cache_dir=cache_dir)
    assert done.returncode == 2 and "no-model" in done.stderr
    bad_data = tmp_path / "wmdp"
    bad_data.mkdir()
    (bad_data / "wmdp-bio.jsonl").write_text(json.dumps({"question": "q?", "choices": "not a list", "answer": 0}) + "\n")
    done = run_pipeline("--run-dir", str(tmp_path / "c"), "--set", f"data.source={bad_data}", "--set", "data.subsets=[bio]", cache_dir=cache_dir)
    assert done.returncode == 2 and "choices" in done.stderr and "wmdp-bio.jsonl" in done.stderr
