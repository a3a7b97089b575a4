"""bench/gpu_check.py, the GPU machine's first command, runs here on CPU (`--smoke`) as it will there."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_smoke_run_passes_every_check_it_can_make_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--smoke", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    checks = json.loads(out.read_text())["checks"]
    assert {name for name, c in checks.items() if c["ok"]} == {"packing", "lora", "gradient_checkpointing", "fsdp2_world_size_1"}
    assert checks["4bit_base"]["ok"] is None and checks["4bit_base"]["skipped"]
    assert checks["packing"]["found_packed"] == checks["packing"]["examples"] > checks["packing"]["packed_rows"]
    assert checks["lora"]["last_loss"] < checks["lora"]["first_loss"]


def test_it_needs_neither_ray_nor_vllm_and_asks_for_a_gpu_without_smoke():
    probe = "import sys; sys.path.insert(0, 'bench'); import gpu_check; print([m for m in ('ray', 'vllm') if m in sys.modules])"
    assert subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300).stdout.strip() == "[]"
    done = subprocess.run([sys.executable, "bench/gpu_check.py"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr
