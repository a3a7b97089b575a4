"""bench/gpu_check.py, the GPU machine's first command, runs here on CPU (`--smoke`) as it will there:
every check that can run without CUDA runs, at narrow widths, and passes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKS = [
    "8b_lora",
    "packing",
    "8b_scoring",
    "logit_kl_ddp",
    "gradient_checkpointing",
    "fsdp2_world_size_1",
    "70b_slice_4bit_ddp",
    "handoff",
    "8b_levers",
]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_check_runs_and_passes_on_cpu(smoke):
    assert list(smoke["checks"]) == CHECKS
    assert {name: c["ok"] for name, c in smoke["checks"].items()} == dict.fromkeys(CHECKS, True)
    assert all(c["seconds"] >= 0 for c in smoke["checks"].values())


def test_lora_training_learns_on_multi_row_packed_batches(smoke):
    check = smoke["checks"]["8b_lora"]
    assert check["parameters"] > check["parameters_without_embeddings"] > 0
    for name, shape in check["shapes"].items():
        assert shape["last_loss"] < shape["first_loss"], name
        assert shape["tokens_per_s"] > 0 and shape["mfu"] is None  # no peak FLOP/s on CPU
        # the dispatcher's choice was read
        assert shape["sdpa_kernels"] and not any("unknown" in k for k in shape["sdpa_kernels"])
    assert check["shapes"]["student"]["packed_rows"] < check["shapes"]["student"]["rows"]


def test_packed_examples_get_their_own_losses_and_gradients(smoke):
    check = smoke["checks"]["packing"]
    assert check["attention"] == "sdpa"
    for shape in check["shapes"].values():
        assert shape["examples"] == shape["rows"] and shape["examples_sharing_a_row"] > 0
        assert shape["worst_loss_gap"] <= 1e-4 and shape["worst_gradient_gap"] <= 1e-4
        assert shape["least_logits_gap_if_leaking"] > 0.1 > 1000 * shape["worst_logits_gap"]  # a leak would show


def test_batched_scoring_matches_each_prompt_alone_and_generation_runs(smoke):
    check = smoke["checks"]["8b_scoring"]
    scoring, generation = check["scoring"], check["generation"]
    assert scoring["rows_sum_to_one"] and check["batched_vs_alone"]["float32_batched_vs_alone_nats"] < 1e-3
    assert (
        100 <= scoring["mean_prompt_tokens"] <= 400
        and scoring["questions_per_s"] > 0
        and scoring["prefill_mfu"] is None
    )
    assert generation["decoded_tokens"] > 0 and generation["decoded_tokens"] <= 22 * generation["prompts"]


def test_logit_kl_under_ddp_matches_the_teacher_it_was_computed_from(smoke):
    check = smoke["checks"]["logit_kl_ddp"]
    assert check["ddp"]
    assert check["untrained"]["kl"] < 1e-5 < check["trained"]["kl"] / 100
    trained = check["trained"]
    assert trained["gradient_gap_stored_vs_in_loop"] < 1e-2  # float16 storage of the targets
    assert trained["kl_after_steps"] < trained["kl"]
    assert trained["teacher_frozen"] and trained["teacher_outside_optimizer"] and trained["teacher_unchanged"]


def test_70b_slice_trains_in_ddp_and_resumes_from_the_trainers_checkpoint(smoke):
    check = smoke["checks"]["70b_slice_4bit_ddp"]
    assert (
        check["backend"] == "gloo"
        and check["quantization"] == "none"
        and check["4bit"] == {"ok": None, "skipped": "bitsandbytes needs CUDA"}
    )
    assert check["ddp_vs_plain_gradient_gap"] <= 1e-5
    ckpt = check["checkpoint"]
    assert ckpt["weights_restored_exactly"] and ckpt["step_after_resume_gap"] <= 1e-5
    assert {"optimizer.pt", "trainable.pt", "state.json"} <= set(ckpt["files_bytes"]) and ckpt["state_step"] > 0
    deep, shallow = check["depths"]["4"], check["depths"]["2"]
    assert check["per_layer"]["parameters"] == (deep["parameters"] - shallow["parameters"]) / 2 > 0
    assert check["extrapolated_80_layers"]["parameters"] == deep["parameters"] + 76 * check["per_layer"]["parameters"]
    assert "x(80)" in check["extrapolated_80_layers"]["formula"]


def test_handoff_kills_the_training_child(smoke):
    check = smoke["checks"]["handoff"]
    assert check["child_exit_code"] == -9 and check["seconds_until_reaped"] < 30
    assert check["gpu_memory"]["ok"] is None and check["gpu_memory"]["skipped"]


def test_it_needs_neither_ray_nor_vllm_and_asks_for_a_gpu_without_smoke():
    """bench/gpu_check.py run as a script without --smoke (one interpreter, which pays torch's
    import once): it exits 2 saying it needs a GPU, and neither its imports nor its run loaded Ray or vLLM."""
    probe = (
        "import runpy, sys\n"
        "sys.argv, sys.path[0] = ['bench/gpu_check.py'], 'bench'  # as `python bench/gpu_check.py` sets them\n"
        "try:\n"
        "    runpy.run_path('bench/gpu_check.py', run_name='__main__')\n"
        "finally:\n"
        "    print([m for m in ('ray', 'vllm') if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr


def test_each_throughput_lever_keeps_the_loss_and_falls_back_where_it_cannot_run(smoke):
    check = smoke["checks"]["8b_levers"]
    ran = {name: v for name, v in check["variants"].items() if "shapes" in v}
    # compiled variants: tests/train/test_levers.py
    assert set(ran) == {"plain", "pack_length 4096", "2x rows a micro-step", "liger"}
    # no CUDA here: Liger's kernels cannot run
    assert check["kernels"].startswith("kernels: liger asked for, the plain path runs: ")
    for name, variant in ran.items():
        for shape, v in variant["shapes"].items():
            assert v["ok"] and v["last_loss"] < v["first_loss"], (name, shape)
            assert v["loss_gap"] is None if variant["rows_factor"] == 2 else v["loss_gap"] <= check["loss_tolerance"], (
                name,
                shape,
            )
    # one sequence, no padding, where max_length packs several
    for shape, v in ran["pack_length 4096"]["shapes"].items():
        assert v["packed_rows"] == 1 < ran["plain"]["shapes"][shape]["packed_rows"] and v["padding_fraction"] == 0
