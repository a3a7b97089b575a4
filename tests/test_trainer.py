"""The distributed LoRA trainer on a real local Ray cluster with real Ray Train workers."""

import json
import random
from pathlib import Path

import pytest
import torch

from train.config import TrainConfig
from train.data import DataError
from train.trainer import train_lora

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
            f.write(json.dumps({"prompt": f"<|user|>\n{name}'s favourite number?\n<|assistant|>\n", "completion": str(favourite[name])}) + "\n")
    return path


def small_config(**overrides) -> TrainConfig:
    base = dict(num_workers=2, batch_size=16, epochs=4, lr=5e-3, log_every=2, checkpoint_every=8, lora_targets=["q_proj", "v_proj", "o_proj"])
    return TrainConfig(**{**base, **overrides})


def logits_of(model, tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    with torch.no_grad():
        return torch.cat([model(**tok(f"<|user|>\n{n}'s favourite number?\n<|assistant|>\n", return_tensors="pt")).logits[0] for n in NAMES[:3]])


def reload_both_ways(tiny_model, adapter_dir: Path, checkpoint_dir: str, cfg: TrainConfig):
    """(logits through PeftModel.from_pretrained, logits of the trained weights from the checkpoint)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from train.model import load_lora_model

    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), str(adapter_dir)).eval()
    trained = load_lora_model(tiny_model, cfg, torch.device("cpu"))
    trained.load_state_dict(torch.load(Path(checkpoint_dir) / "trainable.pt"), strict=False)
    return logits_of(reloaded, tiny_model), logits_of(trained.eval(), tiny_model)


@pytest.mark.timeout(300)
def test_ddp_workers_learn_and_adapter_reloads(ray_cluster, tiny_model, toy_rows, tmp_path, cache_dir):
    cfg = small_config()
    metrics = train_lora(tiny_model, toy_rows, tmp_path / "adapter", cfg, cache_dir=cache_dir)
    assert metrics["done"] and metrics["step"] == metrics["total_steps"] == 32
    assert metrics["loss"] < 0.5 * metrics["first_loss"], metrics
    assert 0 <= metrics["padding_fraction"] < 0.1 and metrics["tokens_per_s"] > 0
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    assert json.loads((tmp_path / "adapter" / "train_metrics.json").read_text())["step"] == 32
    reloaded, trained = reload_both_ways(tiny_model, tmp_path / "adapter", metrics["checkpoint"], cfg)
    torch.testing.assert_close(reloaded, trained, atol=1e-5, rtol=1e-5)
    from transformers import AutoModelForCausalLM

    assert not torch.allclose(reloaded, logits_of(AutoModelForCausalLM.from_pretrained(tiny_model), tiny_model), atol=1e-3)


@pytest.mark.timeout(400)
def test_worker_failure_resumes_from_checkpoint(ray_cluster, tiny_model, toy_rows, tmp_path, cache_dir):
    cfg = small_config(epochs=2, checkpoint_every=4)  # 16 steps, checkpoints at 4, 8, 12, 16
    storage = tmp_path / "ray_train"
    metrics = train_lora(tiny_model, toy_rows, tmp_path / "a1", cfg, storage_path=storage, run_name="run", cache_dir=cache_dir, fail_at_step=6)
    assert metrics["resumed_from_step"] == 4 and metrics["step"] == 16 and metrics["done"]
    # The same storage path and run name continue the finished run rather than training again.
    again = train_lora(tiny_model, toy_rows, tmp_path / "a2", cfg, storage_path=storage, run_name="run", cache_dir=cache_dir)
    assert again["resumed_from_step"] == 16 and again["step"] == 16


@pytest.mark.timeout(300)
def test_fsdp_on_cpu(ray_cluster, tiny_model, toy_rows, tmp_path, cache_dir):
    cfg = small_config(strategy="fsdp")
    metrics = train_lora(tiny_model, toy_rows, tmp_path / "adapter", cfg, cache_dir=cache_dir)
    assert metrics["loss"] < 0.5 * metrics["first_loss"], metrics
    reloaded, trained = reload_both_ways(tiny_model, tmp_path / "adapter", metrics["checkpoint"], cfg)
    torch.testing.assert_close(reloaded, trained, atol=1e-5, rtol=1e-5)


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
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        train_lora(tiny_model, toy_rows, out, cfg, cache_dir=cache_dir)
    assert (out / "keep.txt").read_text() == "mine"


def test_cli_reports_bad_input_without_a_traceback(tmp_path, toy_rows):
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "train", "--model", str(tmp_path / "no-model"), "--data", str(toy_rows), "--output", str(tmp_path / "out")]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "base model" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run(cmd[:3] + ["--set", "lora_rnak=4"] + cmd[3:], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "teacher.lora_rnak" in done.stderr
    assert not (tmp_path / "out").exists()
