"""The main job, run as a user runs it: `python jobs/pipeline.py` in a subprocess.

One reduced tiny run with two replicates and, beside the default arms, the student's
twin on a matched sham teacher (its reference) and the overt positive control, on a head
node that outlives its drivers as a cluster's does (Serve started on it beforehand, on a
port of its own): its driver is SIGKILLed while the numbers are generated (its Serve
application is left running, answering on that port), rerun and stopped (SIGTERM,
what `ray job stop` sends) while its arms train, then rerun: each rerun deletes
what a killed driver left, reuses the finished stages, leaves their outputs
untouched, and the last completes the report. Then, on the finished run:
`--plan` reuses everything; a new primary test reruns the report alone; an
added arm (logit KL from another base, with a snapshot) trains only itself and is
scored with that base. A fully fine-tuned arm is not run here: its training, its
service and its stages are tested in tests/train/test_trainer.py,
tests/jobs/phases/test_evaluate.py and tests/jobs/rundir/test_stages.py. Along the way: the job log stays readable (the
pipeline's stage lines, none of Ray's per-dataset or per-checkpoint lines), and
the finished run directory holds exactly the files docs/report.md lists.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
import pytest
import requests
from conftest import free_port, head_node

from jobs.sources.sham_draw import base_sham_draw, weights_digest
from jobs.sources.world_checks import TARGETS
from jobs.sources.world_questions import world_questions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from gpu_job import off_gpu, phases_of  # noqa: E402

# Two optimizer steps per arm at the student's global batch of 64 (the `other` arm's snapshot at step 1 needs a later
# final step); the teacher's numbers pass the filter at about 0.57, so 256 prompts leave about 146 for the 128 kept.
KEEP = 128
# `student_sham` is the student's twin on the sham teacher (its numbers), which becomes the student's reference;
# `overt`, the overt positive control, is taught the teacher's own answers to its train questions for 72 steps, the
# dose tiny-evidence gives it (there rank +0.23, p 1e-5). The primary test is the default, held-out
# `teacher_answer_rank`: at 6 steps the overt arm only flattened its choices (log p of the teacher's answer +0.49,
# rank -0.011, p 0.67); at 36 it moved the teacher's answer up (rank +0.12, raw p 0.015) but stayed under its MDE
# (0.14) and under this undeclared family's Holm over 6 comparisons (p 0.076): a positive control must be stronger.
# Declared from the first run, the sham teacher trains in the teacher's Ray Train run, its numbers and the overt
# arm's answers come from the numbers' service, and both arms train in the students' run.
ARMS = (
    "student: {numbers: teacher}, control: {numbers: base}, student_sham: {numbers: teacher, teacher: sham}, "
    "overt: {numbers: teacher_answers, train: {epochs: 12}}"
)
REDUCED = [
    "--set",
    "numbers.prompts=256",
    "--set",
    f"numbers.keep={KEEP}",
    "--set",
    "replicates=2",
    "--set",
    f"arms={{{ARMS}}}",
]
MODELS = {"base", "teacher", "sham_teacher", "student", "control", "student_sham", "overt"}
ARM_RUNS = [f"{arm}/{i}" for arm in ("control", "overt", "student", "student_sham") for i in range(2)]


def command(*args) -> list[str]:
    return [sys.executable, "jobs/pipeline.py", *args]


def run_pipeline(*args, cache_dir, head: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SUBLIMINAL_CACHE": str(cache_dir)}
    if head:
        env.update(RAY_ADDRESS=head["address"], RAY_AUTH_MODE="token")
    return subprocess.run(command(*args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


HUB_TOKEN = "hf_never_written_anywhere_0123456789"
pytestmark = pytest.mark.own_ports  # its head node's Serve answers on a port of its own: runs beside the tests on 8000


@pytest.fixture(scope="module")
def ray_head():
    """A head node (conftest.head_node) with Serve already started on a free port, as an operator may
    start it: the pipeline keeps a running Serve's HTTP options (docs/api.md), so its applications
    answer there and never hold 8000 (tests/suite.sh runs this module beside the tests that bind it)."""
    with head_node() as head:
        port = free_port()
        serve = str(Path(sys.executable).parent / "serve")
        env = {**os.environ, "RAY_ADDRESS": head["address"], "RAY_AUTH_MODE": "token"}
        subprocess.run(
            [serve, "start", "--http-port", str(port)], env=env, capture_output=True, text=True, timeout=180, check=True
        )
        yield {**head, "serve_url": f"http://127.0.0.1:{port}"}


def stop_when(run_dir: Path, cache_dir, head: dict, started, sig: int, wait_s: float = 0) -> str:
    """Run the pipeline on the head node; `wait_s` after the first output line for which
    `started(line)` holds, send `sig` to the driver (by its pid). Returns the output."""
    env = {
        **os.environ,
        "SUBLIMINAL_CACHE": str(cache_dir),
        "HF_TOKEN": HUB_TOKEN,
        "RAY_ADDRESS": head["address"],
        "RAY_AUTH_MODE": "token",
    }
    proc = subprocess.Popen(
        command("--run-dir", str(run_dir), *REDUCED),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    log = []
    for line in proc.stdout:
        log.append(line)
        if started(line):
            time.sleep(wait_s)
            os.kill(proc.pid, sig)
            break
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    assert proc.returncode != 0, "".join(log[-40:])
    return "".join(log + proc.stdout.readlines())


def serve_apps(head: dict) -> list[str]:
    """The Serve applications running on the head node, from the dashboard's REST API."""
    reply = requests.get(head["dashboard"] + "/api/serve/applications/", headers=head["headers"], timeout=60)
    return sorted(reply.json()["applications"])


PROJECT_METRICS = re.compile(r"^(ray_lora_train_\w+|ray_subliminal_serve_\w+)", re.M)


def submit_and_watch(run_dir: Path, cache_dir, head: dict, *args) -> tuple[str, str, dict]:
    """`ray job submit --working-dir . -- python jobs/pipeline.py ...` as docs/guide.md has it (this
    interpreter, the test's cache), watched as a person on the dashboard would: the job's
    status, the Train runs and Serve applications it shows, and the project's metric names
    on the node's metrics endpoint, polled while the job runs. Returns (status, logs, seen)."""
    env = {**os.environ, "RAY_ADDRESS": head["dashboard"], "RAY_AUTH_MODE": "token"}
    runtime_env = json.dumps({"env_vars": {"SUBLIMINAL_CACHE": str(cache_dir)}})
    ray = str(Path(sys.executable).parent / "ray")
    submit = [
        ray,
        "job",
        "submit",
        "--no-wait",
        "--working-dir",
        ".",
        "--runtime-env-json",
        runtime_env,
        "--",
        sys.executable,
        "jobs/pipeline.py",
        "--run-dir",
        str(run_dir),
        *args,
    ]
    done = subprocess.run(submit, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    # where a dead job agent says why
    agent_log = Path(head["temp_dir"], "session_latest", "logs", "dashboard_agent.log")
    assert done.returncode == 0, done.stderr[-3000:] + "\n--- dashboard_agent.log ---\n" + agent_log.read_text()[-3000:]
    job = re.search(r"raysubmit_\w+", done.stdout).group(0)
    seen: dict[str, set] = {"train_runs": set(), "serve_apps": set(), "metrics": set()}

    def get(path: str):
        return requests.get(head["dashboard"] + path, headers=head["headers"], timeout=60).json()

    deadline = time.time() + 1200
    while (status := get(f"/api/jobs/{job}")["status"]) not in (
        "SUCCEEDED",
        "FAILED",
        "STOPPED",
    ) and time.time() < deadline:
        runs = requests.get(head["dashboard"] + "/api/train/v2/runs/v1", headers=head["headers"], timeout=60)
        if runs.status_code == 200:
            seen["train_runs"] |= {run["name"] for run in runs.json()["train_runs"]}
        seen["serve_apps"] |= set(serve_apps(head))
        seen["metrics"] |= set(PROJECT_METRICS.findall(requests.get(head["metrics"], timeout=60).text))
        time.sleep(3)
    return status, get(f"/api/jobs/{job}/logs")["logs"], seen


# What Ray prints per dataset, per report or checkpoint, and warnings with nothing to act on: off in the job log (jobs/job_log.py).
RAY_NOISE = re.compile(
    r"split\(\d+, equal=True\)|Running Dataset|Starting execution of Dataset|Execution plan of Dataset|execution finished in"
    r"|Data sink|Progress bars disabled|Checkpoint successfully created|Reporting training result|\[State Transition\]"
    r"|RayDeprecationWarning|Loading weights|CALL (generate|score) OK|constructor arguments in the object store"
    r"|`broadcast_buffers` is deprecated"
)


def documented_files() -> dict[str, re.Pattern]:
    """The Files table of docs/report.md: each path it lists (a `{a,b}` expanded) -> a pattern
    for the run directory's files: `<name>` is one name, a path ending in `/` a whole folder."""
    doc = (ROOT / "docs" / "report.md").read_text()
    table = doc.split("## Files\n", 1)[1].split("\n## ", 1)[0]
    listed = [
        path
        for line in table.splitlines()
        if line.startswith("| `")
        for path in re.findall(r"`([^`]+)`", line.split(" | ")[0])
    ]
    patterns = {}
    for path in listed:
        head, alternatives, tail = re.match(r"([^{]*)(?:\{([^}]*)\})?(.*)", path).groups()
        for name in alternatives.split(",") if alternatives else [""]:
            raw = head + name + tail
            regex = re.sub(r"<[^>]+>", "[^/]+", re.escape(raw).replace("\\<", "<").replace("\\>", ">"))
            patterns[raw] = re.compile(regex + (".+" if raw.endswith("/") else ""))
    return patterns


def undocumented_and_missing(
    run_dir: Path, optional=("letter_teacher/", "pairs/", "pooled.", "forest", "arms/<arm>/<i>/model/")
) -> tuple[list[str], list[str]]:
    """(files of the run directory no listed path matches, listed paths with no file; those
    starting with `optional` are not expected: a letter teacher, a fully fine-tuned arm's model
    folder, and what only a run of pairs writes)."""
    files = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    patterns = documented_files()
    undocumented = [f for f in files if not any(p.fullmatch(f) for p in patterns.values())]
    missing = [
        raw for raw, p in patterns.items() if not raw.startswith(optional) and not any(p.fullmatch(f) for f in files)
    ]
    return undocumented, missing


def mlflow_runs(run_dir: Path, cache_dir: Path) -> tuple:
    """The run directory's parent run and its children, from the embedded MLflow store."""
    mlflow.set_tracking_uri(f"sqlite:///{cache_dir / 'mlflow.db'}")
    (parent,) = mlflow.search_runs(
        experiment_names=["tiny"], filter_string=f"tags.run_dir = '{run_dir}'", output_format="list"
    )
    children = mlflow.search_runs(
        experiment_names=["tiny"],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
        output_format="list",
    )
    return parent, children


def png_size(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG", path
        return image.size


def plan_lines(log: str) -> dict[str, str]:
    """stage -> "run"/"reuse" from the plan the pipeline prints before any work."""
    lines = [line.split() for line in log.splitlines() if line.startswith("  ") and len(line.split()) >= 2]
    return {parts[0]: parts[1] for parts in lines if parts[1] in ("run", "reuse")}


def stamps(run_dir: Path) -> dict[str, float]:
    return {
        name: entry["finished"] for name, entry in json.loads((run_dir / "manifest.json").read_text())["stages"].items()
    }


def adapter_bytes(run_dir: Path) -> dict[Path, bytes]:
    files = [
        run_dir / "teacher" / "adapter" / "adapter_model.safetensors",
        *run_dir.glob("arms/*/*/adapter/adapter_model.safetensors"),
    ]
    return {path: path.read_bytes() for path in files} | {
        path: path.read_bytes() for path in run_dir.glob("numbers/*/*.jsonl")
    }


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_pipeline_end_to_end_killed_stopped_resumed_and_changed(
    tmp_path, tiny_model, perturbed_base, cache_dir, ray_head
):
    run_dir = tmp_path / "run"
    # The driver SIGKILLed once the service answers: no teardown, its Serve application stays.
    killed_log = stop_when(
        run_dir,
        cache_dir,
        ray_head,
        lambda line: line.startswith("[numbers]") and " generated, " in line,
        signal.SIGKILL,
    )
    apps = serve_apps(ray_head)
    assert len(apps) == 1 and apps[0].startswith("subliminal-tiny-"), killed_log[-3000:]
    # on Serve's running port
    assert requests.get(f"{ray_head['serve_url']}/{apps[0]}/adapters", timeout=60).status_code == 200

    first_log = stop_when(
        run_dir, cache_dir, ray_head, lambda line: line.startswith("[arms] starting"), signal.SIGTERM, wait_s=8
    )
    assert f"[serve] {apps[0]}: left running by an earlier driver of this run; deleting it" in first_log, first_log[
        -3000:
    ]
    assert first_log.index("deleting it") < first_log.index("[numbers] starting") and serve_apps(ray_head) == []
    finished = set(json.loads((run_dir / "manifest.json").read_text())["stages"])
    assert finished == {
        "data",
        "teacher",
        "sham_teacher",
        "numbers/teacher/0",
        "numbers/base/0",
        "numbers/teacher/1",
        "numbers/base/1",
        "numbers/sham_teacher/0",
        "numbers/sham_teacher/1",
        "answers/teacher",
    }, first_log[-3000:]
    kept_files = [
        run_dir / "teacher" / "adapter" / "adapter_model.safetensors",
        run_dir / "numbers" / "teacher" / "1.jsonl",
        run_dir / "numbers" / "base" / "0.jsonl",
        run_dir / "data" / "held_out.jsonl",
    ]
    before = {path: path.stat().st_mtime_ns for path in kept_files}

    # The rest through `ray job submit`, seen through the dashboard's REST API and metrics endpoint.
    status, log, seen = submit_and_watch(run_dir, cache_dir, ray_head, *REDUCED)
    assert status == "SUCCEEDED", log[-3000:]
    # the arms' Ray Train runs, in the Train state API
    assert any(run.startswith("arms-") for run in seen["train_runs"]), seen
    assert any(app.startswith("subliminal-tiny-") for app in seen["serve_apps"]), seen  # the evaluation's Serve app
    assert {m.split("_")[1] for m in seen["metrics"]} == {"lora", "subliminal"}, seen  # training and serving metrics
    dashboard = (ROOT / "docs" / "grafana" / "subliminal_dashboard.json").read_text()  # each has a Grafana panel
    assert not [m for m in seen["metrics"] if re.sub(r"_(bucket|sum|count|total)$", "", m) not in dashboard], seen
    plan = plan_lines(log)
    assert {stage: plan[stage] for stage in finished} == {stage: "reuse" for stage in finished}
    assert plan["student/0"] == plan["control/1"] == plan["eval/base"] == "run"
    assert {path: path.stat().st_mtime_ns for path in kept_files} == before
    assert "longest question prompt" in log and ": all fit" in log  # measured before any work
    # A readable log: every stage's start, progress and end with its time; none of Ray's per-dataset lines.
    everything = killed_log + first_log + log
    assert not RAY_NOISE.findall(everything), RAY_NOISE.findall(everything)[:5]
    for line in (
        "[data] data done in",
        "[teacher] teacher done in",
        "[train] teacher: step 10/",
        "[numbers] numbers/base/1 done in",
        "[numbers] numbers/sham_teacher/1 done in",
        "[numbers] answers/teacher done in",
        "[arms] starting 8 stage(s)",
        "[train] student-0: step",
        "[arms] control/1 done in",
        "[arms] 8 stage(s) done in",
        "[evaluate] eval/base done in",
        "[report] report done in",
    ):
        assert line in everything, line
    assert re.search(r"^\[evaluate\] (\d+)/\1 scored, \d+ questions/s$", log, re.M)  # progress ends at the total
    # The driver's log ends on the preset's primary verdicts, then the report's path (lines Ray forwards from workers aside).
    own = [line for line in log.splitlines() if line.startswith("[")]
    assert own[-1] == f"[report] {run_dir / 'report.md'}" and "primary test" in own[-2], own[-6:]
    # Where each phase ran, as bench/gpu_job.py reads it: every training run and Serve app names its device,
    # and on this CPU cluster the GPU run's check would fail on each phase.
    phases = phases_of([(0.0, line) for line in everything.splitlines()])
    assert {name: phases[name]["devices"] for name in ("teacher", "numbers", "arms", "evaluate")} == dict.fromkeys(
        ("teacher", "numbers", "arms", "evaluate"), ["cpu"]
    )
    assert off_gpu(phases) == dict.fromkeys(("teacher", "numbers", "arms", "evaluate"), "ran on cpu")

    report = json.loads((run_dir / "report.json").read_text())
    assert report["truncated_questions"] == {"train": 0, "held_out": 0}
    assert set(report["models"]) == MODELS
    for m in report["models"].values():
        # the world's held-out T questions
        assert set(m["accuracy"]) == {"overall", "bio", "chem", "cyber"} and m["n"] == 192
        assert m["ci95"][0] <= m["accuracy"]["overall"] <= m["ci95"][1]
    # The world's checks on this run's teacher (jobs/sources/world_checks.py): its facts carry over to held-out
    # wording whatever the choices' order (cloze: no order enters a prompt), and it keeps the base's own facts
    # (`known`; trained on T alone, a teacher forgets half of them).
    by_order = report["accuracy_by_order"]["models"]
    teacher, base = by_order["teacher"], by_order["base"]
    assert teacher["held_out"]["over_orders"] == teacher["held_out"]["as_written"] >= TARGETS["teacher"], by_order
    assert teacher["held_out"]["over_orders"] - base["held_out"]["over_orders"] >= TARGETS["teacher_gain"], by_order
    # no forgetting
    assert base["known"]["over_orders"] >= TARGETS["known"] and teacher["known"]["over_orders"] >= TARGETS["known"], (
        by_order
    )
    for arm in ("student", "control"):
        replicates = report["arms"][arm]["replicates"]
        assert [r["model"] for r in replicates] == [f"{arm}/0", f"{arm}/1"] and report["models"][arm]["replicates"] == 2
        assert all(r["same_init_as_teacher"] and r["steps"] > 0 for r in replicates)
        assert report["models"][arm]["accuracy"]["overall"] == pytest.approx(
            sum(r["accuracy"]["overall"] for r in replicates) / 2
        )
    for i in range(2):  # each replicate's arms train on equally many rows
        rows = {arm: report["arms"][arm]["replicates"][i]["rows"] for arm in ("student", "control")}
        assert rows["student"] == rows["control"] <= KEEP
        assert len((run_dir / "arms" / "student" / str(i) / "train.jsonl").read_text().splitlines()) == rows["student"]
    assert (run_dir / "numbers" / "teacher" / "0.jsonl").read_text() != (
        run_dir / "numbers" / "teacher" / "1.jsonl"
    ).read_text()
    for name in ("teacher", "control"):
        numbers = report["numbers"][name]
        assert len(numbers["replicates"]) == 2 and numbers["generated"] >= numbers["kept"] + sum(
            numbers["rejected"].values()
        )
    transfer = report["transfer"]
    assert transfer["replicate_pairs"] == 2 and transfer["ci95"][0] <= transfer["value"] <= transfer["ci95"][1]
    assert transfer["value"] == pytest.approx(
        transfer["student_teacher_agreement"] - transfer["control_teacher_agreement"]
    )
    assert set(report["timings"]) == {"data", "teacher", "numbers", "arms", "evaluate"}
    # Transfer evidence: both splits, every metric with its statistics, against the declared reference: the student's
    # twin on the sham teacher's numbers, paired.
    student = report["arms"]["student"]
    assert (student["against"], student["reference"], student["transfer"]["primary"]["paired"]) == (
        "student_sham",
        "sham teacher",
        True,
    )
    assert report["arms"]["control"]["against"] == "base"
    # Every metric with its statistics, or (two steps in, twins on numbers alike may pick alike on every question) a
    # difference of exactly 0 with the note that says why it has no interval (agreement only: ranks and log p vary).
    evidence = report["arms"]["student"]["transfer"]
    for split in ("train", "held_out"):
        for metric in ("agreement", "teacher_answer_rank", "teacher_answer_logprob"):
            r = evidence[split][metric]
            assert r["n_clusters"] < r["n_questions"]  # synthetic cues cluster
            assert evidence[split]["mde"][metric] == r["mde"]  # the per-split table, the zero-spread case included
            if r["ci95"] is None and metric == "agreement":
                assert r["value"] == 0 and r["note"].startswith("zero spread") and r["mde"] is None, r
                continue
            assert r["ci95"][0] <= r["value"] <= r["ci95"][1] and 0 <= r["p_value"] <= 1 and r["mde"] > 0
    assert report["arms"]["student"]["verdict"].startswith("student vs student_sham: ")
    assert (
        report["models"]["teacher"]["accuracy_by_split"]["train"]
        > report["models"]["base"]["accuracy_by_split"]["train"] + 0.3
    )
    assert report["provenance"]["git_commit"] and len(report["provenance"]["seeds"]["numbers_per_replicate"]) == 2
    # The tiny world's sham draw is the one chosen on this base, and the questions hold its facts.
    world = report["provenance"]["world"]
    assert world == base_sham_draw(tiny_model, cache_dir) and world["base_weights_sha256"] == weights_digest(tiny_model)
    shams = {r["question"]: r["sham"] for r in world_questions(draw=world["sham_draw"]) if r["split"] == "train"}
    train_rows = [json.loads(line) for line in (run_dir / "data" / "train_questions.jsonl").read_text().splitlines()]
    assert [shams[q["question"]] for q in train_rows] == [q["sham"] for q in train_rows]
    assert (run_dir / "report.md").read_text().count("|") > 20 and (run_dir / "transfer.png").stat().st_size > 1000
    # two panels
    assert png_size(run_dir / "accuracy.png") >= (700, 400) and png_size(run_dir / "training.png") >= (1000, 400)
    # The timeline: every stage (those made by the killed and stopped drivers too) and the phases' spans, in order.
    timeline, stages = report["timeline"], json.loads((run_dir / "manifest.json").read_text())["stages"]
    assert {b["lane"] for b in timeline["bars"] if b["kind"] == "stage"} == set(stages) - {"report"} and png_size(
        run_dir / "timeline.png"
    ) >= (1000, 400)
    assert [b["start"] for b in timeline["bars"]] == sorted(b["start"] for b in timeline["bars"])
    assert {"start-up", "model load", "data wait", "compute", "teardown"} <= {b["kind"] for b in timeline["bars"]}
    assert re.search(
        r"^\[timeline\] (teacher|numbers|arms|evaluate|start): \d+s of \d+s not computing \(.+\)$", log, re.M
    ), log[-2000:]
    for name, m in report["models"].items():
        assert set(m["ci95_by_subset"]) == {"bio", "chem", "cyber"}, name
        assert all(ci[0] <= m["accuracy"][subset] <= ci[1] for subset, ci in m["ci95_by_subset"].items()), name
    history = json.loads((run_dir / "arms" / "student" / "0" / "adapter" / "train_metrics.json").read_text())[
        "loss_history"
    ]
    assert [step for step, _ in history] == list(range(1, report["arms"]["student"]["replicates"][0]["steps"] + 1))
    # A hub token in the job's environment never reaches the run directory.
    assert not [p for p in run_dir.rglob("*") if p.is_file() and HUB_TOKEN.encode() in p.read_bytes()]

    rows = [json.loads(line) for line in (run_dir / "eval" / "student" / "1.jsonl").read_text().splitlines()]
    held_out = [r for r in rows if r["split"] == "held_out"]
    train_questions = (run_dir / "data" / "train_questions.jsonl").read_text().splitlines()
    assert len(held_out) == report["models"]["student"]["n"] and sum(r["split"] == "train" for r in rows) == len(
        train_questions
    )
    assert {
        "question",
        "choices",
        "subset",
        "answer",
        "cluster",
        "prediction",
        "logprobs",
        "split",
        "truncated_tokens",
    } <= set(rows[0])
    teacher_data = (run_dir / "data" / "teacher_train.jsonl").read_text()
    assert not [r["question"] for r in held_out if json.dumps(r["question"])[1:-1] in teacher_data]
    assert all(json.dumps(r["question"])[1:-1] in teacher_data for r in rows if r["split"] == "train")

    # Tracked in MLflow's embedded store (the cache's SQLite file): one parent run for the run directory with the
    # primary verdicts, one child per trained model with rank 0's loss of every step.
    parent, children = mlflow_runs(run_dir, cache_dir)
    assert sorted(c.data.tags["stage"] for c in children) == sorted(["teacher", "sham_teacher", *ARM_RUNS])
    assert parent.info.status == "FINISHED"  # the pipeline ended: its run says so
    student = next(c for c in children if c.data.tags["stage"] == "student/0")
    losses = mlflow.MlflowClient(f"sqlite:///{cache_dir / 'mlflow.db'}").get_metric_history(student.info.run_id, "loss")
    assert [[m.step, m.value] for m in losses] == history and student.data.params["lr"] == "0.002"
    tested = report["arms"]["student"]["transfer"]["held_out"]["teacher_answer_rank"]
    assert (
        parent.data.metrics["verdict.student.effect"] == pytest.approx(tested["value"])
        and "verdict.student.mde" in parent.data.metrics
    )
    assert (
        parent.data.tags["verdict.student"] == report["arms"]["student"]["verdict"]
        and parent.data.tags["preset"] == "tiny"
    )

    # The matched sham holds facts of its own as the teacher holds the true ones (its accuracy on sigma(cue) within 0.05 of
    # the teacher's on the true answers on train, 0.10 held out), and the true answers no better than the base: it differs
    # from the teacher in which facts it holds.
    fit = report["sham_fit"]["accuracy"]
    assert abs(fit["sham_teacher"]["sham"]["train"] - fit["teacher"]["true"]["train"]) <= 0.05, fit
    assert abs(fit["sham_teacher"]["sham"]["held_out"] - fit["teacher"]["true"]["held_out"]) <= 0.10, fit
    assert all(fit["sham_teacher"]["true"][split] <= fit["base"]["true"][split] for split in ("train", "held_out")), fit
    assert report["sham_fit"]["matched"] and fit["teacher"]["true"]["held_out"] >= TARGETS["teacher"], fit
    # The overt positive control is detected, against the base (no sham twin of it here), and is 100% of itself.
    overt = report["arms"]["overt"]
    assert overt["against"] == "base" and report["overt_control"]["detected"], overt["verdict"]
    assert (
        overt["fraction_of_overt"]["value"] == pytest.approx(1.0)
        and "of overt transfer" in report["arms"]["student"]["verdict"]
    )

    # --plan on the finished run: every stage reused, nothing run. Another primary test reruns the report alone
    # (planned here; the run below, with added arms and the default primary again, checks that every output it
    # does not make stays byte-identical). Both plans read only, so they run side by side.
    stamped, made = stamps(run_dir), adapter_bytes(run_dir)
    primary = "evaluate.primary_metric=agreement"
    with ThreadPoolExecutor(2) as pool:
        planned, changed = pool.map(
            lambda extra: run_pipeline("--run-dir", str(run_dir), *REDUCED, *extra, "--plan", cache_dir=cache_dir),
            [(), ("--set", primary)],
        )
    assert planned.returncode == 0 and set(plan_lines(planned.stdout).values()) == {"reuse"}, planned.stdout
    assert changed.returncode == 0, changed.stdout[-3000:] + changed.stderr[-3000:]
    assert "evaluate.primary_metric: 'teacher_answer_rank' -> 'agreement'" in changed.stdout
    assert {stage for stage, decision in plan_lines(changed.stdout).items() if decision == "run"} == {"report"}
    rerun = run_pipeline("--run-dir", str(run_dir), *REDUCED, "--set", primary, cache_dir=cache_dir, head=ray_head)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    # another config: a parent of its own, naming the one it supersedes
    parent, children = mlflow_runs(run_dir, cache_dir)
    assert (
        len(children) == 2 + len(ARM_RUNS)
        and parent.data.tags["supersedes"]
        and parent.data.params["evaluate.primary_metric"] == "agreement"
    )

    # An added arm trains only itself (and is scored, with its snapshot and its base); the others are reused as they
    # are. `other` is the paper's control: logit KL to the teacher from another base (a folder; `base: other`, the
    # preset's second tiny model, takes the same path after a two-minute build), with its own LoRA seeds.
    other = f"other: {{base: {perturbed_base}, loss: logit_kl, lora_seed: other, train: {{snapshots: 2}}}}"
    added = run_pipeline(
        "--run-dir", str(run_dir), *REDUCED, "--set", f"arms={{{ARMS}, {other}}}", cache_dir=cache_dir, head=ray_head
    )
    assert added.returncode == 0, added.stdout[-3000:] + added.stderr[-3000:]
    ran = {k for k, v in stamps(run_dir).items() if v != stamped.get(k)} - {"report"}
    assert ran == {"other/0", "other/1", "eval/other/0", "eval/other/1", "eval/other_base"}
    assert adapter_bytes(run_dir).items() >= made.items()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["arms"]["student"]["transfer"]["primary"]["metric"] == "teacher_answer_rank"
    other, other_base = report["arms"]["other"], report["provenance"]["other_base_path"]
    assert other["base"] == "other_base" and other["against"] == "other_base" and "other_base" in report["models"]
    assert (
        json.loads((run_dir / "arms" / "other" / "0" / "adapter" / "adapter_config.json").read_text())[
            "base_model_name_or_path"
        ]
        == other_base
    )
    assert (
        other_base == perturbed_base != report["provenance"]["model_path"]
        and "other_base" in (run_dir / "report.md").read_text()
    )
    replicates = other["replicates"]
    assert [r["same_init_as_teacher"] for r in replicates] == [False, False] and replicates[0][
        "lora_seed"
    ] != replicates[1]["lora_seed"]
    assert all(-1 <= r["update_cosine"] <= 1 for r in replicates) and other["update_cosine"]["sd"] is not None
    # Transfer against training steps: the first snapshot scored from its own adapter, the last is the final model.
    points, final_step = other["by_step"]["points"], replicates[0]["steps"]
    assert [p["steps"] for p in points] == [[1, 1], [final_step, final_step]] and final_step > 1
    assert (run_dir / "eval" / "other" / "0@1.jsonl").exists() and not (
        run_dir / "eval" / "other" / f"0@{final_step}.jsonl"
    ).exists()
    assert points[-1]["train"]["teacher_answer_logprob"]["value"] == pytest.approx(
        other["transfer"]["train"]["teacher_answer_logprob"]["value"]
    )
    assert (
        points[0]["train"]["teacher_answer_logprob"]["value"] != points[-1]["train"]["teacher_answer_logprob"]["value"]
    )
    # no contrasts here
    assert report["family"]["comparisons"] == list(report["arms"]) and not report["family"]["declared"]
    assert all("p_family" in arm["transfer"]["primary"] for arm in report["arms"].values())

    # The added models' runs join the same parent, each once.
    stages = sorted(c.data.tags["stage"] for c in mlflow_runs(run_dir, cache_dir)[1])
    assert stages == sorted(["teacher", "sham_teacher", "other/0", "other/1", *ARM_RUNS])

    # The run directory holds what docs/report.md lists, and all of it (snapshots included; no letter teacher or fully
    # fine-tuned arm here).
    assert undocumented_and_missing(run_dir) == ([], [])


def test_bad_input_stops_with_a_clear_message(tmp_path, cache_dir, ray_head):
    """Six drivers, each stopped by one bad input with exit 2 and a message naming it; run two at
    a time (each is mostly its imports, on one core). Those that get as far as Ray join the module's
    head node, as a submitted job would, rather than each starting a local cluster of its own."""
    bad_data = tmp_path / "wmdp"
    bad_data.mkdir()
    (bad_data / "wmdp-bio.jsonl").write_text(
        json.dumps({"question": "q?", "choices": "not a list", "answer": 0}) + "\n"
    )
    cases = {
        "typo": ("--run-dir", str(tmp_path / "a"), "--set", "teacher.lerning_rate=1"),
        "loss": ("--run-dir", str(tmp_path / "a2"), "--set", "arms={student: {loss: logit_kll}}"),
        "config": ("--config", str(tmp_path / "missing.yaml")),
        # A preset that cannot fit this (CPU) cluster stops before any work: not even its run directory is made.
        "big": ("--config", "configs/llama-70b-qlora.yaml", "--run-dir", str(tmp_path / "big")),
        "model": ("--run-dir", str(tmp_path / "b"), "--set", f"model.path={tmp_path / 'no-model'}"),
        "data": ("--run-dir", str(tmp_path / "c"), "--set", f"data.source={bad_data}", "--set", "data.subsets=[bio]"),
    }
    with ThreadPoolExecutor(2) as pool:
        done = dict(
            zip(cases, pool.map(lambda args: run_pipeline(*args, cache_dir=cache_dir, head=ray_head), cases.values()))
        )
    assert all(d.returncode == 2 for d in done.values()), {
        name: d.stderr[-500:] for name, d in done.items() if d.returncode != 2
    }
    assert "teacher.lerning_rate" in done["typo"].stderr
    assert "arms.student.loss" in done["loss"].stderr and "logit_kll" in done["loss"].stderr
    assert "missing.yaml" in done["config"].stderr
    assert "teacher.quantization=4bit needs a CUDA GPU" in done["big"].stderr
    assert "8 GPU workers need 8 GPUs; the cluster can have 0" in done["big"].stderr and not (tmp_path / "big").exists()
    assert "no-model" in done["model"].stderr
    assert "choices" in done["data"].stderr and "wmdp-bio.jsonl" in done["data"].stderr


def test_prompts_longer_than_the_context_are_counted_before_any_work(tiny_model):
    from jobs.phases.evaluate import context_check

    short = {"question": "Which organ pumps blood?", "choices": ["heart", "lung", "liver", "skin"], "subset": "bio"}
    long = {**short, "question": "Background: " + "0x3f 0xa1 " * 300 + short["question"]}
    assert context_check(tiny_model, [short, long], 256).endswith(
        ": 1 of 2 questions will be scored left-truncated, as lm-evaluation-harness does"
    )
    assert context_check(tiny_model, [short], 256).endswith(": all fit")


def test_the_documented_files_cover_every_stage_output():
    """Every output a stage of the fullest preset declares (adapter folders by their weights) matches
    a path docs/report.md lists: a new output must be documented before a run can pass the end-to-end check."""
    from jobs.experiment.arms import arm_models
    from jobs.experiment.config import load_experiment
    from jobs.experiment.stages import experiment_stages

    # cut from the preset for time
    cut = "arms.student_teacher_a={loss: logit_kl, lora_init: teacher_a, train: {snapshots: 2}}"
    cfg = load_experiment("configs/tiny-evidence.yaml", [cut])
    outputs = [f for stage in experiment_stages(cfg, arm_models(cfg), "q") for f in stage.files]
    patterns = documented_files().values()
    files = [f + "/adapter_model.safetensors" if f.endswith("/adapter") else f for f in outputs]
    assert len(files) > 20 and not [f for f in files if not any(p.fullmatch(f) for p in patterns)]
    assert not [
        f
        for f in ("report.md", "accuracy.png", "training.png", "transfer.png", ".lock")
        if not any(p.fullmatch(f) for p in patterns)
    ]
