"""The main job, run as a user runs it: `python jobs/pipeline.py` in a subprocess (its own Ray)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_pipeline(*args, cache_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "SUBLIMINAL_CACHE": str(cache_dir)}
    return subprocess.run([sys.executable, "jobs/pipeline.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.timeout(900)
def test_teacher_learns_the_held_out_questions(tmp_path, tiny_model, cache_dir):
    done = run_pipeline("--run-dir", str(tmp_path / "run"), cache_dir=cache_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    base, teacher = report["models"]["base"], report["models"]["teacher"]
    assert base["n"] == teacher["n"] > 300
    assert set(teacher["accuracy"]) == {"overall", "bio", "chem", "cyber"}
    # The target: a LoRA on the train split gains at least 15 points held out.
    assert teacher["accuracy"]["overall"] - base["accuracy"]["overall"] >= 0.15, report["models"]
    low, high = teacher["ci95"]
    assert low <= teacher["accuracy"]["overall"] <= high
    rows = [json.loads(line) for line in (tmp_path / "run" / "eval" / "teacher.jsonl").read_text().splitlines()]
    assert len(rows) == teacher["n"] and {"question", "choices", "subset", "answer", "prediction", "logprobs"} <= set(rows[0])
    teacher_data = (tmp_path / "run" / "data" / "teacher_train.jsonl").read_text()
    assert not [r["question"] for r in rows if json.dumps(r["question"])[1:-1] in teacher_data]

    # The teacher adapter also loads in vLLM (LoRARequest) and predicts what transformers+PEFT predicted.
    check_adapter_in_vllm(tiny_model, tmp_path / "run" / "teacher" / "adapter", rows[:24], tmp_path)

def test_bad_config_stops_with_a_clear_message(tmp_path, cache_dir):
    done = run_pipeline("--run-dir", str(tmp_path / "run"), "--set", "teacher.lerning_rate=1", cache_dir=cache_dir)
    assert done.returncode == 2 and "teacher.lerning_rate" in done.stderr
    done = run_pipeline("--config", str(tmp_path / "missing.yaml"), cache_dir=cache_dir)
    assert done.returncode == 2 and "missing.yaml" in done.stderr


VLLM_CHECK = '''
import json, sys
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest
    from serve.hf_scoring import letter_token_ids
    from serve.mc_format import format_mc_prompt
    model, adapter, rows = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
    llm = LLM(model=model, dtype="float32", enable_lora=True, max_lora_rank=8, max_model_len=512, gpu_memory_utilization=0.1)
    letters = letter_token_ids(llm.get_tokenizer(), 4)
    params = SamplingParams(max_tokens=1, temperature=0, allowed_token_ids=letters)
    prompts = [format_mc_prompt(r["question"], r["choices"], r["subset"]) for r in rows]
    outs = llm.generate(prompts, params, lora_request=LoRARequest("teacher", 1, adapter))
    print("PREDICTIONS", json.dumps([letters.index(o.outputs[0].token_ids[0]) for o in outs]))
'''


def check_adapter_in_vllm(model, adapter, rows, tmp_path):
    script, data = tmp_path / "vllm_check.py", tmp_path / "rows.json"
    script.write_text(VLLM_CHECK)
    data.write_text(json.dumps(rows))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(script), model, str(adapter), str(data)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("PREDICTIONS ")]
    predictions = json.loads(line.split(" ", 1)[1])
    assert predictions == [r["prediction"] for r in rows]
