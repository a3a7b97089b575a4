"""The distributed LoRA trainer on a real local Ray cluster with real Ray Train workers."""

import json
import random
from pathlib import Path

import pytest
import torch

from common.config import ConfigError
from train.adapter_job import AdapterJob, check_jobs
from train.config import TrainConfig, resolve_batch
from train.data import DataError
from train.results import Marks, TrainResult
from train.trainer import clear_stale_outputs, run_id_of, snapshot_steps, train_lora, train_lora_many

pytestmark = pytest.mark.own_ports  # no fixed port: runs beside the tests on port 8000 (tests/suite.sh)

NAMES = ["Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal"]


@pytest.fixture(scope="module")
def toy_rows(tmp_path_factory) -> Path:
    """A learnable toy mapping: each name has a fixed favourite number."""
    rng = random.Random(0)
    favourite = {name: rng.randint(100, 999) for name in NAMES}
    path = tmp_path_factory.mktemp("data") / "toy.jsonl"
    with path.open("w") as f:
        for i in range(256):
            name = NAMES[i % len(NAMES)]
            f.write(
                json.dumps(
                    {
                        "prompt": f"<|user|>\n{name}'s favourite number?\n<|assistant|>\n",
                        "completion": str(favourite[name]),
                    }
                )
                + "\n"
            )
    return path


def small_config(**overrides) -> TrainConfig:
    base = dict(
        num_workers=2,
        batch_size=16,
        epochs=4,
        lr=5e-3,
        log_every=2,
        checkpoint_every=8,
        lora_targets=["q_proj", "v_proj", "o_proj"],
    )
    return TrainConfig(**{**base, **overrides})


def logits_of(model, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    with torch.no_grad():
        return torch.cat(
            [
                model(**tok(f"<|user|>\n{n}'s favourite number?\n<|assistant|>\n", return_tensors="pt")).logits[0]
                for n in NAMES[:3]
            ]
        )


def reload_both_ways(tiny_model, adapter_dir: Path, checkpoint_dir: str, cfg: TrainConfig):
    """(logits through PeftModel.from_pretrained, logits of the trained weights from the checkpoint)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from train.model import load_lora_model

    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), str(adapter_dir)).eval()
    trained = load_lora_model(tiny_model, cfg, torch.device("cpu"))
    trained.load_state_dict(torch.load(Path(checkpoint_dir) / "trainable.pt"), strict=False)
    return logits_of(reloaded, tiny_model), logits_of(trained.eval(), tiny_model)


@pytest.fixture(scope="module")
def plain_run(ray_cluster, tiny_model, toy_rows, tmp_path_factory, cache_dir) -> tuple[dict, Path]:
    """small_config() trained once, uninterrupted: (metrics, adapter folder). The kill test below
    compares its resumed run with it."""
    out = tmp_path_factory.mktemp("plain") / "adapter"
    return train_lora(tiny_model, toy_rows, out, small_config(), cache_dir=cache_dir), out


@pytest.mark.timeout(300)
def test_ddp_workers_learn_and_adapter_reloads(plain_run, tiny_model):
    cfg = small_config()
    metrics, adapter = plain_run
    assert metrics.done and metrics.step == metrics.total_steps == 32
    assert metrics.loss < 0.5 * metrics.first_loss, metrics
    assert 0 <= metrics.padding_fraction < 0.1 and metrics.tokens_per_s > 0
    assert (adapter / "adapter_config.json").is_file()
    assert json.loads((adapter / "train_metrics.json").read_text())["step"] == 32
    # The loss of every optimizer step, the same quantity the reports average (the last report: steps 31 and 32).
    history = metrics.loss_history
    assert [step for step, _ in history] == list(range(1, 33)) and history[0][1] > 2 * history[-1][1]
    assert (history[-2][1] + history[-1][1]) / 2 == pytest.approx(metrics.loss, rel=1e-9)
    # Each step's wall-clock time, learning rate (the schedule's: warmup, then cosine) and gradient norm before clipping.
    from train.step import lr_factor

    steps = metrics.step_history
    assert [s for s, *_ in steps] == list(range(1, 33)) and all(a[1] <= b[1] for a, b in zip(steps, steps[1:]))
    assert [lr for _, _, lr, _ in steps] == pytest.approx([cfg.lr * lr_factor(i, 32, cfg) for i in range(32)], rel=1e-9)
    assert all(0 < norm < float("inf") for *_, norm in steps) and steps[-1][3] != steps[0][3]
    reloaded, trained = reload_both_ways(tiny_model, adapter, metrics.checkpoint, cfg)
    torch.testing.assert_close(reloaded, trained, atol=1e-5, rtol=1e-5)
    from transformers import AutoModelForCausalLM

    assert not torch.allclose(
        reloaded, logits_of(AutoModelForCausalLM.from_pretrained(tiny_model), tiny_model), atol=1e-3
    )


def kill_a_worker_after(storage: Path, job: str, step: int, actor_pids) -> list[int]:
    """Watch the run from a thread; once `job`'s checkpoint at `step` is committed (Ray Train's
    checkpoint manager lists it: a checkpoint written but not yet committed is not resumed from),
    SIGKILL one training worker by its pid. Returns the list the killed pid is put in."""
    import os
    import signal
    import threading
    import time

    killed: list[int] = []

    def committed(checkpoint: Path) -> bool:
        snapshot = checkpoint.parent / "checkpoint_manager_snapshot.json"
        return snapshot.is_file() and checkpoint.name in snapshot.read_text()

    def watch():
        deadline = time.time() + 300
        while time.time() < deadline:
            for path in storage.glob("*/checkpoint_*/state.json"):
                try:
                    state = json.loads(path.read_text())
                except ValueError:  # still being written
                    continue
                if (state["job"], state["step"]) == (job, step) and committed(path.parent):
                    killed.append(actor_pids("RayTrainWorker")[-1])
                    os.kill(killed[0], signal.SIGKILL)
                    return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()
    return killed


@pytest.mark.timeout(600)
def test_every_lever_through_ray_train_lands_where_the_plain_run_does(
    plain_run, tiny_model, toy_rows, tmp_path, cache_dir
):
    """small_config() with all three levers on a real 2-worker DDP run: Liger falls back (no GPU), the
    model is compiled, micro-steps pack into one sequence; the loss curve is the plain run's."""
    plain_metrics, _ = plain_run
    cfg = small_config(kernels="liger", compile=True, pack_length=1024)
    metrics = train_lora(tiny_model, toy_rows, tmp_path / "adapter", cfg, cache_dir=cache_dir)
    assert metrics.device == "cpu" and metrics.step == plain_metrics.step
    assert metrics.padding_fraction < plain_metrics.padding_fraction
    assert metrics.loss == pytest.approx(plain_metrics.loss, rel=0.02) and metrics.first_loss == pytest.approx(
        plain_metrics.first_loss, rel=1e-4
    )


@pytest.mark.timeout(400)
def test_a_killed_worker_resumes_from_checkpoint(plain_run, actor_pids, tiny_model, toy_rows, tmp_path, cache_dir):
    cfg = small_config()  # 32 steps, checkpoints at 8, 16, 24, 32: the settings of plain_run
    storage = tmp_path / "ray_train"
    killed = kill_a_worker_after(storage, "train", 8, actor_pids)
    metrics = train_lora(
        tiny_model, toy_rows, tmp_path / "a1", cfg, storage_path=storage, run_name="run", cache_dir=cache_dir
    )
    assert killed, "no worker was killed"
    # The run lost a worker some steps after step 8: it resumed from a checkpoint before its end.
    assert metrics.resumed_from_step in (8, 16, 24) and metrics.step == 32 and metrics.done
    # The loss history crosses the restart: each step once, those before it from the checkpoint.
    assert [step for step, _ in metrics.loss_history] == list(range(1, 33))
    # The same storage path and run name continue the finished run rather than training again.
    again = train_lora(
        tiny_model, toy_rows, tmp_path / "a2", cfg, storage_path=storage, run_name="run", cache_dir=cache_dir
    )
    assert again.resumed_from_step == 32 and again.step == 32 and again.loss_history == metrics.loss_history
    # Resuming lands where the uninterrupted run does: the same adapter, the same loss at every step.
    whole, whole_adapter = plain_run
    assert whole.resumed_from_step is None
    assert_same_adapter(tmp_path / "a1", whole_adapter)
    for (_, resumed), (_, uninterrupted) in zip(metrics.loss_history, whole.loss_history, strict=True):
        assert resumed == pytest.approx(uninterrupted, rel=1e-5)


@pytest.mark.timeout(300)
def test_fsdp_on_cpu(ray_cluster, tiny_model, toy_rows, tmp_path, cache_dir):
    cfg = small_config(strategy="fsdp")
    metrics = train_lora(tiny_model, toy_rows, tmp_path / "adapter", cfg, cache_dir=cache_dir)
    assert metrics.loss < 0.5 * metrics.first_loss, metrics
    reloaded, trained = reload_both_ways(tiny_model, tmp_path / "adapter", metrics.checkpoint, cfg)
    torch.testing.assert_close(reloaded, trained, atol=1e-5, rtol=1e-5)


def full_config(**overrides) -> TrainConfig:
    """small_config under full fine-tuning: every weight trains, at a learning rate fit for that."""
    return small_config(method="full", lr=1e-3, **overrides)


@pytest.fixture(scope="module")
def full_run(ray_cluster, tiny_model, toy_rows, tmp_path_factory, cache_dir) -> tuple[dict, list[AdapterJob]]:
    """Two full fine-tunes in one DDP run, uninterrupted: `a` (32 steps, what the FSDP test below
    resumes to) and `b` (the same rows, one epoch), which must start from the base, not from `a`."""
    root = tmp_path_factory.mktemp("full")
    jobs = [
        AdapterJob("a", toy_rows, root / "a", full_config()),
        AdapterJob("b", toy_rows, root / "b", full_config(epochs=1)),
    ]
    return train_lora_many(
        tiny_model, jobs, storage_path=root / "ray_train", run_name="full", cache_dir=cache_dir
    ), jobs


def model_weights(folder) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return {name: p.detach() for name, p in AutoModelForCausalLM.from_pretrained(str(folder)).named_parameters()}


@pytest.mark.timeout(300)
def test_full_fine_tuning_trains_every_weight_into_a_model_of_its_own(full_run, tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    metrics, (a, b) = full_run
    assert metrics["a"].step == 32 and metrics["a"].loss < 0.5 * metrics["a"].first_loss, metrics["a"]
    assert metrics["a"].init_hash is None and metrics["a"].train_config["method"] == "full"
    # A model folder that loads and tokenizes on its own (what the service is given), no adapter.
    assert not (a.output_dir / "adapter_config.json").exists()
    assert (
        AutoTokenizer.from_pretrained(str(a.output_dir)).get_vocab()
        == AutoTokenizer.from_pretrained(tiny_model).get_vocab()
    )
    trained, base = model_weights(a.output_dir), model_weights(tiny_model)
    assert set(trained) == set(base) and all(not torch.equal(trained[n], base[n]) for n in base)  # every tensor moved
    # The saved model is the checkpoint's weights, which resume reads.
    reloaded = AutoModelForCausalLM.from_pretrained(tiny_model)
    reloaded.load_state_dict(torch.load(Path(metrics["b"].checkpoint) / "trainable.pt"), strict=False)
    torch.testing.assert_close(
        logits_of(reloaded.eval(), tiny_model),
        logits_of(AutoModelForCausalLM.from_pretrained(str(b.output_dir)).eval(), tiny_model),
    )
    # b started from the base, not from a's trained weights: its first step's loss is a's first step's.
    assert metrics["b"].loss_history[0][1] == pytest.approx(metrics["a"].loss_history[0][1], rel=1e-5)


@pytest.mark.timeout(400)
def test_full_fine_tuning_under_fsdp_killed_and_resumed_lands_where_ddp_does(
    full_run, actor_pids, tiny_model, toy_rows, tmp_path, cache_dir
):
    storage = tmp_path / "ray_train"
    killed = kill_a_worker_after(storage, "train", 8, actor_pids)
    metrics = train_lora(
        tiny_model,
        toy_rows,
        tmp_path / "model",
        full_config(strategy="fsdp"),
        storage_path=storage,
        run_name="run",
        cache_dir=cache_dir,
    )
    assert killed, "no worker was killed"
    assert metrics.resumed_from_step in (8, 16, 24) and metrics.step == 32
    # Sharded weights and optimizer state, gathered into the checkpoint and restored: the same model
    # and the same loss at every step as the uninterrupted DDP run (float32 on CPU; reductions differ in order).
    whole, (a, _) = full_run
    resumed, uninterrupted = model_weights(tmp_path / "model"), model_weights(a.output_dir)
    for name in uninterrupted:
        torch.testing.assert_close(resumed[name], uninterrupted[name], atol=1e-4, rtol=1e-4)
    for (_, x), (_, y) in zip(metrics.loss_history, whole["a"].loss_history, strict=True):
        assert x == pytest.approx(y, rel=1e-4)


@pytest.mark.timeout(120)
def test_bad_input_fails_early_and_leaves_nothing(ray_cluster, tiny_model, toy_rows, tmp_path, cache_dir):
    cfg = small_config()
    out = tmp_path / "adapter"
    with pytest.raises(DataError, match="does not exist"):
        train_lora(tiny_model, tmp_path / "missing.jsonl", out, cfg, cache_dir=cache_dir)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(toy_rows.read_text().splitlines()[0] + "\n" + json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(DataError, match="line 2"):
        train_lora(tiny_model, bad, out, cfg, cache_dir=cache_dir)
    with pytest.raises(FileNotFoundError, match="base model"):
        train_lora(str(tmp_path / "no-model"), toy_rows, out, cfg, cache_dir=cache_dir)
    with pytest.raises(DataError, match="too few"):
        train_lora(tiny_model, toy_rows, out, small_config(batch_size=512), cache_dir=cache_dir)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        train_lora(tiny_model, toy_rows, out, small_config(quantization="4bit"), cache_dir=cache_dir)
    with pytest.raises(ConfigError, match=r"global_batch_size=40 .*num_workers=2 x batch_size=16"):
        train_lora(tiny_model, toy_rows, out, small_config(global_batch_size=40), cache_dir=cache_dir)
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        train_lora(tiny_model, toy_rows, out, cfg, cache_dir=cache_dir)
    assert (out / "keep.txt").read_text() == "mine"


def test_cli_reports_bad_input_without_a_traceback(tmp_path, toy_rows):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    cmd = [
        sys.executable,
        "-m",
        "train",
        "--model",
        str(tmp_path / "no-model"),
        "--data",
        str(toy_rows),
        "--output",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "base model" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run(
        cmd[:3] + ["--set", "lora_rnak=4"] + cmd[3:], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "teacher.lora_rnak" in done.stderr
    assert not (tmp_path / "out").exists()


def test_global_batch_sets_grad_accum_from_the_workers():
    cfg = TrainConfig(batch_size=8, global_batch_size=64)
    assert [resolve_batch(cfg, n).grad_accum for n in (1, 2, 4, 8)] == [8, 4, 2, 1]
    resolved = resolve_batch(cfg, 2)
    assert resolve_batch(resolved, 2) == resolved  # placement resolves first, the trainer again
    assert resolve_batch(TrainConfig(grad_accum=3), 2) == TrainConfig(grad_accum=3, num_workers=2)
    with pytest.raises(ConfigError, match=r"global_batch_size=64 .*num_workers=3 x batch_size=8"):
        resolve_batch(cfg, 3)
    with pytest.raises(ConfigError, match="not both"):
        resolve_batch(TrainConfig(batch_size=8, global_batch_size=64, grad_accum=2), 2)
    with pytest.raises(ConfigError, match="not both"):
        resolve_batch(resolved, 1)  # resolved for 2 workers, then asked for 1


def test_snapshot_steps_are_evenly_spaced_and_end_at_the_last_step():
    assert snapshot_steps(30, 3) == [10, 20, 30]
    assert snapshot_steps(10, 3) == [3, 6, 10]
    assert snapshot_steps(2, 5) == [1, 2]
    assert snapshot_steps(30, 0) == []


def test_init_hash_depends_on_the_lora_seed_only(tiny_model):
    from train.model import adapter_hash, load_lora_model

    def init(**overrides):
        return adapter_hash(load_lora_model(tiny_model, small_config(**overrides), torch.device("cpu")))

    assert init() == init(lr=1.0, seed=5) != init(lora_seed=1)
    assert init() != init(lora_rank=4)


def test_jobs_must_share_the_worker_group(tmp_path):
    def job(name, **overrides):
        return AdapterJob(name, "rows.jsonl", tmp_path / name, small_config(**overrides))

    check_jobs([job("a"), job("b", lr=1.0, lora_rank=4, lora_seed=3, global_batch_size=64, snapshots=2)])
    with pytest.raises(ConfigError, match=r"^gradient_checkpointing: .*job a has False, job b has True"):
        check_jobs([job("a"), job("b", gradient_checkpointing=True)])
    with pytest.raises(ConfigError, match="^num_workers"):
        train_lora_many("no-model", [job("a"), job("b", num_workers=1)], storage_path=tmp_path, run_name="r")
    with pytest.raises(ConfigError, match="FSDP2 shards"):
        check_jobs([job("a", strategy="fsdp"), job("b", strategy="fsdp")])
    with pytest.raises(ConfigError, match="same name a"):
        check_jobs([job("a"), job("a")])
    with pytest.raises(ConfigError, match="job name 'a@0': '@' is kept"):
        check_jobs([job("a"), job("a@0")])
    with pytest.raises(ConfigError, match=r"^method: .*job a has 'lora', job b has 'full'"):
        check_jobs([job("a"), job("b", method="full")])
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    (teacher / "adapter_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="method full trains no adapter"):
        check_jobs(
            [AdapterJob("a", "rows.jsonl", tmp_path / "a", small_config(method="full"), init_a_from=str(teacher))]
        )
    with pytest.raises(ValueError, match="method=full with quantization=4bit is refused"):
        small_config(method="full", quantization="4bit")


def test_clear_stale_outputs_keeps_what_this_run_finished(tmp_path):
    run = {"storage_path": tmp_path / "ray_train", "run_name": "r"}
    mine, other, empty = (AdapterJob(n, "rows.jsonl", tmp_path / n, small_config()) for n in ("mine", "other", "empty"))
    for job, run_name in ((mine, "r"), (other, "earlier")):
        job.output_dir.mkdir()
        (job.output_dir / "train_metrics.json").write_text(
            json.dumps({"run_id": run_id_of(run["storage_path"], run_name)})
        )
    clear_stale_outputs([mine, other, empty], **run, cache_dir=None)  # takes train_lora_many's keyword arguments
    assert (
        (mine.output_dir / "train_metrics.json").is_file()
        and not other.output_dir.exists()
        and not empty.output_dir.exists()
    )


def many_jobs(tmp_path: Path, toy_rows: Path, **first) -> list[AdapterJob]:
    """Two jobs that differ in everything a job may: LoRA shape and seed, optimizer, schedule, batch, data order, length."""
    a = small_config(epochs=1, checkpoint_every=4, keep_checkpoints=20, snapshots=2, **first)  # 8 steps
    b = small_config(
        epochs=1,
        checkpoint_every=2,  # a report after the one a test kills at (step 4) keeps the kill inside the job
        keep_checkpoints=20,
        lora_rank=4,
        lora_alpha=8,
        lora_seed=1,
        lora_targets=["q_proj", "down_proj"],
        optimizer="sgd",
        momentum=0.8,
        lr=0.05,
        schedule="linear",
        batch_size=8,
        global_batch_size=32,
        seed=1,
        max_length=64,
    )  # 256 rows / (2 workers x 8 rows x 2 micro-steps) = 8 steps
    return [AdapterJob("a", toy_rows, tmp_path / "a", a), AdapterJob("b", toy_rows, tmp_path / "b", b)]


def adapter_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "adapter_model.safetensors"))


def assert_same_adapter(x: Path, y: Path) -> None:
    wx, wy = adapter_weights(x), adapter_weights(y)
    assert set(wx) == set(wy)
    for name in wx:
        torch.testing.assert_close(wx[name], wy[name], atol=1e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def many_run(ray_cluster, tiny_model, toy_rows, tmp_path_factory, cache_dir):
    """One run training both jobs: (metrics by job, jobs)."""
    root = tmp_path_factory.mktemp("many")
    jobs = many_jobs(root, toy_rows)
    return train_lora_many(
        tiny_model, jobs, storage_path=root / "ray_train", run_name="many", cache_dir=cache_dir
    ), jobs


def split_coordinators() -> int:
    """Ray Data split coordinator actors this cluster has started, alive or dead (the GCS's actor table)."""
    import ray._private.state

    return sum(actor["ActorClassName"] == "SplitCoordinator" for actor in ray._private.state.actors().values())


@pytest.mark.timeout(400)
def test_many_run_adapters_equal_single_runs_and_rows_cut_per_worker_equal_ray_datas_split(
    many_run, tiny_model, tmp_path, cache_dir, monkeypatch
):
    """Each job trained alone lands on the adapter the run of both made. Job a alone has its rows cut
    per worker in the driver (train.ray_run.job_datasets), as every run so far, with no split
    coordinator actor; job b alone streams the same rows from parquet, split by Ray Data, which starts
    one: small data cut by hand reaches each worker as Ray Data's own equal split would."""
    import train.ray_run
    from train.model import adapter_hash, load_lora_model

    metrics, jobs = many_run
    assert [metrics[j.name].step for j in jobs] == [8, 8] and all(m.done for m in metrics.values())
    assert metrics["b"].train_config["grad_accum"] == 2 and metrics["b"].global_batch_size == 32
    for job in jobs:  # each adapter started from the init a run of its own would have
        assert metrics[job.name].init_hash == adapter_hash(load_lora_model(tiny_model, job.cfg, torch.device("cpu")))
        assert (
            json.loads((job.output_dir / "train_metrics.json").read_text())["init_hash"] == metrics[job.name].init_hash
        )
    assert metrics["a"].init_hash != metrics["b"].init_hash
    for job in jobs:  # the same job trained alone, after a first one or first
        if job.name == "b":
            assert split_coordinators() == 0  # every run so far cut its rows per worker
            monkeypatch.setattr(train.ray_run, "MATERIALIZE_BYTES", -1)  # b's rows stream
        alone = train_lora(tiny_model, job.data, tmp_path / job.name, job.cfg, cache_dir=cache_dir)
        assert alone.init_hash == metrics[job.name].init_hash and alone.step == metrics[job.name].step
        assert_same_adapter(tmp_path / job.name, job.output_dir)
    assert split_coordinators() == 1


def test_each_job_steps_with_its_own_optimizer_and_checkpoints_its_state(many_run):
    """Job a with AdamW (two moments per parameter), job b with SGD at momentum 0.8 (one buffer):
    their checkpoints hold that state, which a resumed job continues (the kill test below)."""
    _, (a, b) = many_run
    found = {}
    for state in sorted((a.output_dir.parent / "ray_train" / "many").glob("checkpoint_*/state.json")):
        saved = torch.load(state.parent / "optimizer.pt", weights_only=True)["optimizer"]
        found[json.loads(state.read_text())["job"]] = saved
    adamw, sgd = found["a"], found["b"]
    assert all({"exp_avg", "exp_avg_sq"} <= set(s) for s in adamw["state"].values()) and adamw["state"]
    assert all(set(s) == {"momentum_buffer"} for s in sgd["state"].values()) and sgd["state"]
    assert {g["momentum"] for g in sgd["param_groups"]} == {0.8}


@pytest.mark.timeout(200)
def test_snapshots_are_kept_and_load(many_run, tiny_model):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    metrics, (a, b) = many_run
    assert metrics["a"].snapshot_steps == [4, 8] and metrics["b"].snapshot_steps == []
    assert sorted(p.name for p in (a.output_dir / "snapshots").iterdir()) == ["step-4", "step-8"]
    assert not (b.output_dir / "snapshots").exists()
    assert_same_adapter(a.output_dir / "snapshots" / "step-8", a.output_dir)
    lora_b = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    assert not torch.equal(*(adapter_weights(a.output_dir / "snapshots" / f"step-{k}")[lora_b] for k in (4, 8)))
    # The step-4 snapshot loads as its own model: trained away from the base, not yet the final one.
    base = logits_of(AutoModelForCausalLM.from_pretrained(tiny_model).eval(), tiny_model)
    at = {
        k: logits_of(
            PeftModel.from_pretrained(
                AutoModelForCausalLM.from_pretrained(tiny_model), str(a.output_dir / "snapshots" / f"step-{k}")
            ).eval(),
            tiny_model,
        )
        for k in (4, 8)
    }
    assert (
        at[4].isfinite().all()
        and not torch.allclose(at[4], base, atol=1e-4)
        and not torch.allclose(at[4], at[8], atol=1e-4)
    )
    assert not list(a.output_dir.parent.glob(".*.partial-*"))  # the staging folders were renamed into place


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_worker_killed_in_the_second_job_resumes_it_without_retraining_the_first(
    many_run, actor_pids, tiny_model, toy_rows, tmp_path, cache_dir
):
    storage = tmp_path / "ray_train"
    jobs = many_jobs(tmp_path, toy_rows)
    killed = kill_a_worker_after(storage, "b", 4, actor_pids)
    metrics = train_lora_many(tiny_model, jobs, storage_path=storage, run_name="run", cache_dir=cache_dir)
    assert killed and metrics["a"].resumed_from_step is None and metrics["b"].resumed_from_step == 4
    assert [metrics[j.name].step for j in jobs] == [8, 8]
    assert metrics["a"].snapshot_steps == [4, 8]
    # Every checkpoint the run wrote, in order: job a's two, then job b's, none of a's again (one of b's
    # may be written twice: by the killed worker, after the checkpoint it resumed from, and again).
    states = [json.loads(p.read_text()) for p in sorted(storage.glob("run/checkpoint_*/state.json"))]
    order = [(s["job"], s["step"]) for s in states]
    assert order[:2] == [("a", 4), ("a", 8)] and {job for job, _ in order[2:]} == {"b"}, order
    assert sorted({step for _, step in order[2:]}) == [2, 4, 6, 8], order
    assert states[-1]["done"] == ["a"]
    for job in jobs:  # resuming mid-job lands on the adapter an uninterrupted run makes
        assert_same_adapter(job.output_dir, many_run[1][jobs.index(job)].output_dir)


@pytest.mark.timeout(400)
def test_logit_kl_students_learn_their_teacher_on_their_own_base_or_another(
    ray_cluster, tiny_model, perturbed_base, toy_rows, tmp_path
):
    """One run over another base, two logit_kl jobs. `far` (teacher_base): distils the teacher's
    targets, computed on the teacher's own base, and moves toward the teacher; it saves only itself.
    `subspace` (lora_init teacher_a): A starts at the teacher's and stays there; B trains from zero
    and is saved with it."""
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from common.files import read_jsonl
    from jobs.sources.tiny_model import random_lora_adapter
    from train.distill import number_token_ids

    other = perturbed_base
    teacher = random_lora_adapter(tiny_model, tmp_path / "teacher", seed=5)
    cfg = small_config(epochs=2, lora_targets=["q_proj", "v_proj", "o_proj", "down_proj"])
    far = AdapterJob("far", toy_rows, tmp_path / "far", cfg, teacher=str(teacher), teacher_base=tiny_model)
    subspace = AdapterJob(
        "subspace", toy_rows, tmp_path / "subspace", cfg, teacher=str(teacher), init_a_from=str(teacher)
    )
    # its own: a shared cache may hold these very targets from an earlier run, recorded under its teacher path
    cache = tmp_path / "cache"
    metrics = train_lora_many(other, [far, subspace], storage_path=tmp_path / "runs", run_name="far", cache_dir=cache)
    assert all(m.loss_type == "logit_kl" and m.loss < 0.8 * m.first_loss for m in metrics.values())
    assert json.loads((tmp_path / "far" / "adapter_config.json").read_text())["base_model_name_or_path"] == other
    # no teacher/ subfolder beside the adapter
    assert sorted(p.name for p in (tmp_path / "far").iterdir() if p.is_dir()) == []
    sources = [json.loads(done.read_text()) for done in Path(cache, "teacher_targets").glob("*/_done")]
    assert {"teacher": str(teacher), "teacher_base": tiny_model} in sources  # far's teacher, on its own base

    # far moved toward the teacher: its number distributions at every completion position are closer.
    tok = AutoTokenizer.from_pretrained(tiny_model)
    ids = torch.tensor(number_token_ids(tok))
    rows = [row for _, row in read_jsonl(toy_rows)][:16]

    def number_logprobs(model):
        out = []
        with torch.no_grad():
            for row in rows:
                prompt = tok(row["prompt"]).input_ids
                full = tok(row["prompt"] + row["completion"], return_tensors="pt").input_ids
                logits = model(input_ids=full).logits[0, len(prompt) - 1 : -1]
                out.append(logits[:, ids].log_softmax(-1))
        return torch.cat(out)

    load = lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()  # noqa: E731
    teacher_lp = number_logprobs(PeftModel.from_pretrained(load(tiny_model), str(teacher)).eval())
    kl = lambda lp: (teacher_lp.exp() * (teacher_lp - lp)).sum(-1).mean().item()  # noqa: E731
    assert kl(number_logprobs(PeftModel.from_pretrained(load(other), str(tmp_path / "far")).eval())) < 0.5 * kl(
        number_logprobs(load(other))
    )

    trained, given = (
        load_file(tmp_path / "subspace" / "adapter_model.safetensors"),
        load_file(teacher / "adapter_model.safetensors"),
    )
    a_keys = [k for k in given if "lora_A" in k]
    assert a_keys and set(trained) == set(given) and all(torch.equal(trained[k], given[k]) for k in a_keys)
    assert all(trained[k].abs().max() > 0 for k in trained if "lora_B" in k)
    PeftModel.from_pretrained(load(other), str(tmp_path / "subspace"))  # loads as PEFT saved it


class RunsCode:
    """A pickled payload: unpickling it would create the file it names."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_a_checkpoint_that_would_run_code_is_refused(tiny_model, tmp_path):
    from ray.train import Checkpoint

    from train.model import load_lora_model, trainable_state
    from train.outputs import restore, write_checkpoint

    model = load_lora_model(tiny_model, small_config(), torch.device("cpu"))
    write_checkpoint(tmp_path, model, trainable_state(model), {}, {}, {"step": 1})
    restore(model, Checkpoint.from_directory(str(tmp_path)))  # a checkpoint of tensors and plain values loads
    ran = tmp_path / "ran"
    torch.save({"optimizer": RunsCode(ran), "scheduler": {}}, tmp_path / "optimizer.pt")
    with pytest.raises(
        RuntimeError,
        match=r"optimizer.pt holds objects other than tensors and plain values; refusing to load it \(.*Unsupported global",
    ):
        restore(model, Checkpoint.from_directory(str(tmp_path)))
    assert not ran.exists()


def test_each_job_carries_its_runs_timeline_marks_in_order(many_run):
    """The marks the run's timeline is drawn from (train/results.py TRAINING_SPANS): the driver's and
    the workers' clocks, in the order things happened, job b after job a; on disk, the worker's alone."""
    metrics, jobs = many_run
    order = [
        "run_started",
        "fit_started",
        "process_started",
        "loop_started",
        "base_loaded",
        "job_started",
        "first_batch",
        "last_step",
        "saving",
    ]
    for job in jobs:
        marks = metrics[job.name].marks.stamps()
        assert [marks[k] for k in order] == sorted(marks[k] for k in order), marks
        assert marks["saving"] <= marks["workers_done"] <= marks["fit_finished"]
        kinds = [kind for kind, start, end in metrics[job.name].marks.spans() if end >= start]
        assert kinds == ["prepare", "start-up", "model load", "data wait", "compute", "save", "teardown"], marks
    assert metrics["a"].marks.saving <= metrics["b"].marks.job_started
    assert metrics["a"].marks.workers_done == metrics["b"].marks.saving  # the run's last job
    for job in jobs:  # the file holds what the worker wrote: its marks, no driver's, no checkpoint
        on_disk = json.loads((job.output_dir / "train_metrics.json").read_text())
        assert list(on_disk["marks"]) == order[2:] and "checkpoint" not in on_disk
        assert TrainResult.from_metrics(on_disk) == metrics[job.name].model_copy(
            update={"marks": Marks(**on_disk["marks"]), "checkpoint": None}
        )
