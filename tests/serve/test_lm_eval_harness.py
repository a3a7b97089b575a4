"""lm-evaluation-harness's OpenAI client against the service, and the OpenAI routes it relies on.

The service runs as an operator starts it: a real `serve run` subprocess on a copy of
serve/config.yaml (engine and scoring `auto`: vLLM generates, transformers scores prompts on
CPU) with three overrides: the tiny model, one registered adapter, and a free port, in a Ray cluster
of its own (tests/serve_run_process.py). Everything goes over real HTTP.

The harness scores the WMDP-format task of bench/lm_eval_reference.py twice, through the service
(`local-completions`: token-id prompts, `echo`, `logprobs`) and with its own `hf` backend on the
same model, and every per-choice log-likelihood must agree, so wrong echoed log-probabilities
(shifted by a position, from another adapter, or of the sampled rather than the prompt's tokens)
fail the test even where the predictions would happen to survive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml
from serve_run_process import LOG, serve_run_started, stop_serve_run  # tests/ is on the path, as for conftest

from jobs.sources.wmdp import synthetic_questions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from lm_eval_reference import TASK, read_predictions, run_lm_eval, write_task  # noqa: E402

pytestmark = pytest.mark.slow


MAX_BODY_BYTES = 12 << 20


@pytest.fixture(scope="module")
def served(tiny_model, lora_adapters):
    """`python -m serve.run` (a local Ray of its own, as `serve run` starts one) on serve/config.yaml
    with the tiny model, adapter "a", a free port and a 12 MiB max_body_bytes: {"url", "model", "log"}."""
    config = yaml.safe_load((ROOT / "serve" / "config.yaml").read_text())
    (app,) = config["applications"]
    app["args"].update(model=tiny_model, kv_cache_gib=0.5, max_body_bytes=MAX_BODY_BYTES)
    app["deployments"][0]["user_config"] = {"adapters": {"a": lora_adapters["a"]}}
    proc, temp_dir, url = serve_run_started(config)
    try:
        yield {
            "url": url,
            "model": requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"],
            "log": Path(temp_dir) / LOG,
        }
    finally:
        stop_serve_run(proc, temp_dir)


@pytest.fixture(scope="module")
def questions():
    rows = synthetic_questions(n_per_subset=8, seed=11)
    return [
        {"question": r["question"], "choices": r["choices"], "answer": r["answer"], "subject": r["subset"]}
        for r in rows
    ]


def post(served, path, body):
    return requests.post(served["url"] + path, json=body, timeout=120)


def samples(output_dir: Path) -> dict[int, list[list]]:
    """Per question (by idx), lm-eval's [log-likelihood, is_greedy] of each choice."""
    (file,) = Path(output_dir).rglob(f"samples_{TASK}_*.jsonl")
    return {s["doc"]["idx"]: s["filtered_resps"] for s in map(json.loads, file.read_text().splitlines())}


def accuracy(output_dir: Path) -> float:
    (file,) = Path(output_dir).rglob("results_*.json")
    return json.loads(file.read_text())["results"][TASK]["acc,none"]


def run_lm_eval_service(url: str, model: str, tokenizer: str, questions: list[dict], workdir: Path) -> list[int]:
    """lm-eval's `local-completions` through the service; the questions' predictions, in input order.

    `add_bos_token=True`: the hf backend's tokenizer adds "<s>" by default, the API models do not,
    and the two must score the same token sequences. batch_size 16: 16 prompts per request."""
    task_dir = write_task(questions, workdir)
    model_args = (
        f"model={model},base_url={url}/v1/completions,tokenizer={tokenizer},tokenizer_backend=huggingface,"
        "add_bos_token=True,max_length=512,max_retries=1,timeout=120"
    )
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--tasks",
        TASK,
        "--include_path",
        str(task_dir),
        "--batch_size",
        "16",
        "--log_samples",
        "--output_path",
        str(workdir / "lm_eval_output"),
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(workdir / "hf_datasets_cache"),
    }
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    (workdir / "lm_eval.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, "\n".join(proc.stderr.splitlines()[-40:])
    return read_predictions(workdir / "lm_eval_output", len(questions))


@pytest.mark.parametrize("adapter", [None, "a"])
def test_lm_eval_through_the_service_scores_as_its_hf_backend(
    served, questions, tiny_model, lora_adapters, tmp_path, adapter
):
    model = adapter or served["model"]
    through = run_lm_eval_service(served["url"], model, tiny_model, questions, tmp_path / "service")
    direct, _ = run_lm_eval(tiny_model, lora_adapters[adapter] if adapter else None, questions, tmp_path / "hf")
    assert through == direct
    assert accuracy(tmp_path / "service" / "lm_eval_output") == accuracy(tmp_path / "hf" / "lm_eval_output")
    by_service, by_hf = samples(tmp_path / "service" / "lm_eval_output"), samples(tmp_path / "hf" / "lm_eval_output")
    assert sorted(by_service) == sorted(by_hf) == list(range(len(questions)))
    for idx, choices in by_hf.items():
        for (loglik, greedy), (served_loglik, served_greedy) in zip(choices, by_service[idx]):
            assert abs(float(loglik) - float(served_loglik)) < 1e-4, (idx, loglik, served_loglik)
            assert greedy == served_greedy, idx
    print(
        f"\n[lm-eval {model}] acc through the service {accuracy(tmp_path / 'service' / 'lm_eval_output')}, hf backend {accuracy(tmp_path / 'hf' / 'lm_eval_output')}"
    )


def reference(tiny_model, adapter_path, ids: list[int], new_tokens: int):
    """transformers (+ PEFT), greedy: the prompt and its continuation's token ids (up to an end of
    sequence), and the log-softmax after each prefix (row j for token j + 1)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    if adapter_path:
        model = PeftModel.from_pretrained(model, adapter_path)
    model.eval()
    full = list(ids)
    with torch.inference_mode():
        for _ in range(new_tokens):
            full.append(int(model(torch.tensor([full])).logits[0, -1].argmax()))
            if full[-1] == model.config.eos_token_id:
                break
        return full, torch.log_softmax(model(torch.tensor([full])).logits[0].float(), dim=-1)


@pytest.mark.parametrize("adapter", [None, "a"])
def test_echo_with_logprobs_gives_the_models_log_probabilities(served, questions, tiny_model, lora_adapters, adapter):
    """Greedy, so generated tokens' log-probabilities are the model's too: every entry is checked."""
    from transformers import AutoTokenizer

    from serve.mc_format import format_mc_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = format_mc_prompt(questions[0]["question"], questions[0]["choices"], questions[0]["subject"])
    ids = tokenizer(text).input_ids
    full, logprobs = reference(tiny_model, lora_adapters[adapter] if adapter else None, ids, 4)
    body = {
        "model": adapter or served["model"],
        "prompt": ids,
        "echo": True,
        "logprobs": 3,
        "max_tokens": 4,
        "temperature": 0,
    }
    (choice,) = post(served, "/v1/completions", body).json()["choices"]
    lp, n = choice["logprobs"], len(full)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["tokens"] == [tokenizer.decode([i]) for i in full] and lp["tokens"][0] == "<s>"
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n)]
    generated = tokenizer.decode(full[len(ids) :], skip_special_tokens=True)
    assert choice["text"] == "<s>" + text + generated
    for j in range(1, n):
        row = logprobs[j - 1]
        assert abs(lp["token_logprobs"][j] - row[full[j]].item()) < 1e-4, j
        values, top_ids = row.topk(3)
        expected = {tokenizer.decode([i]): v for i, v in zip(top_ids.tolist(), values.tolist())}
        top = lp["top_logprobs"][j]
        assert lp["tokens"][j] in top and set(expected) <= set(top) and len(top) <= 4, (j, top, expected)
        assert all(abs(top[t] - v) < 1e-4 for t, v in expected.items()), j
        if j >= len(ids):  # greedy: each generated token is the most likely one
            assert lp["token_logprobs"][j] == max(top.values())
    # The same prompt as text: tokenized by the service with the same "<s>", the same answer.
    as_text = post(served, "/v1/completions", {**body, "prompt": text}).json()["choices"][0]
    assert as_text["text"] == text + generated and as_text["logprobs"]["tokens"] == lp["tokens"]
    assert max(abs(a - b) for a, b in zip(as_text["logprobs"]["token_logprobs"][1:], lp["token_logprobs"][1:])) < 1e-5
    # echo alone (max_tokens 0): the prompt's text and its tokens' entries, nothing generated.
    alone = post(served, "/v1/completions", {**body, "prompt": [ids, ids[:5]], "max_tokens": 0}).json()
    first, second = alone["choices"]
    assert first["text"] == "<s>" + text and second["logprobs"]["tokens"] == lp["tokens"][:5]
    assert (
        max(abs(a - b) for a, b in zip(first["logprobs"]["token_logprobs"][1:], lp["token_logprobs"][1 : len(ids)]))
        < 1e-5
    )
    assert alone["usage"] == {"prompt_tokens": len(ids) + 5, "completion_tokens": 0, "total_tokens": len(ids) + 5}


def test_an_echoed_answer_is_sized_before_any_work_and_shares_its_prompt_block(served):
    """Echo with logprobs lists the prompt's entries in each of its n choices: 8 prompts of 500 ids, n 16,
    20 alternatives would list 1,344,000 log-probabilities (within max_work_per_request, 4,194,304), over
    max_logprobs_per_answer: refused before any work. Within it, a prompt's n choices list the same entries."""
    ids = list(range(5, 505))
    amplified = {"model": served["model"], "prompt": [ids] * 8, "echo": True, "logprobs": 20, "max_tokens": 0, "n": 16}
    refused = post(served, "/v1/completions", amplified)
    assert (
        refused.status_code == 413 and "max_logprobs_per_answer is 1,048,576" in refused.json()["error"]["message"]
    ), refused.text
    assert "1,344,000 log-probabilities" in refused.json()["error"]["message"]
    small = post(
        served, "/v1/completions", {**amplified, "prompt": [ids[:40], ids[40:90]], "n": 3, "logprobs": 2}
    ).json()["choices"]
    blocks = [c["logprobs"] for c in small]
    assert len(blocks) == 6 and blocks[0] == blocks[1] == blocks[2] != blocks[3] == blocks[4] == blocks[5]
    assert len(blocks[0]["tokens"]) == 40 and len(blocks[3]["tokens"]) == 50


def test_logprobs_without_echo_cover_the_completion_only(served, tiny_model):
    from transformers import AutoTokenizer

    # the turn tags too
    special = {t.content for t in AutoTokenizer.from_pretrained(tiny_model).added_tokens_decoder.values() if t.special}
    body = {
        "model": served["model"],
        "prompt": ["hello", "The following"],
        "logprobs": 0,
        "max_tokens": 5,
        "temperature": 0.8,
        "seed": 3,
        "n": 2,
    }
    out = post(served, "/v1/completions", body).json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    for c in out["choices"]:
        lp = c["logprobs"]
        assert 1 <= len(lp["tokens"]) <= 5 and None not in lp["token_logprobs"]
        # logprobs 0: the token alone
        assert all(list(top) == [token] for token, top in zip(lp["tokens"], lp["top_logprobs"]))
        # a special token (end of sequence, a turn tag) has an entry, not text
        assert "".join(t for t in lp["tokens"] if t not in special) == c["text"]
    # seeded: choice j samples with seed + j
    assert post(served, "/v1/completions", body).json()["choices"] == out["choices"]


REFUSED = [
    ({"stream": True}, "stream"),
    ({"suffix": "!"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"logit_bias": {"17": 5.0}}, "logit_bias"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"frequency_penalty": -1.0}, "frequency_penalty"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"top_k": 5}, "top_k"),  # vLLM's own extension: unknown here, and refused like any unknown field
    ({"max_tokens": 0}, "max_tokens"),  # without echo
    ({"logprobs": 21}, "logprobs"),
    ({"prompt": [1, 100000]}, "vocabulary"),
    ({"prompt": [[1, 2], []]}, "prompt"),
]


@pytest.mark.parametrize("extra,names", REFUSED, ids=[n for _, n in REFUSED])
def test_openai_fields_that_would_change_the_answer_are_refused(served, extra, names):
    """A 400 in OpenAI's shape, as OpenAI's and vLLM's servers answer, naming the field."""
    response = post(served, "/v1/completions", {"model": served["model"], "prompt": "hello", "max_tokens": 2, **extra})
    assert response.status_code == 400 and names in response.json()["error"]["message"], response.text


def test_harmless_openai_fields_are_accepted(served):
    neutral = {
        "user": "u1",
        "stream": False,
        "best_of": 1,
        "logit_bias": {},
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "suffix": None,
        "echo": False,
    }
    response = post(
        served, "/v1/completions", {"model": served["model"], "prompt": "hello", "max_tokens": 2, **neutral}
    )
    assert response.status_code == 200, response.text


def test_chat_completions_with_the_openai_client(served, tiny_model):
    """The chat route is the completions route on the model's chat template, with the assistant's turn opened."""
    from openai import BadRequestError, OpenAI
    from transformers import AutoTokenizer

    client = OpenAI(base_url=served["url"] + "/v1", api_key="unused")
    messages = [{"role": "user", "content": "Continue this sequence: 412, 87, 903."}]
    out = client.chat.completions.create(
        model=served["model"], messages=messages, max_tokens=8, temperature=0, logprobs=True, top_logprobs=2
    )
    (choice,) = out.choices
    assert choice.message.role == "assistant" and choice.finish_reason in {"stop", "length"}
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids = tokenizer(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    ).input_ids
    assert out.usage.prompt_tokens == len(ids) and 1 <= out.usage.completion_tokens <= 8
    same = post(
        served,
        "/v1/completions",
        {"model": served["model"], "prompt": ids, "max_tokens": 8, "temperature": 0, "logprobs": 2},
    ).json()
    assert choice.message.content == same["choices"][0]["text"]
    assert [t.token for t in choice.logprobs.content] == same["choices"][0]["logprobs"]["tokens"]
    assert (
        max(
            abs(t.logprob - v)
            for t, v in zip(choice.logprobs.content, same["choices"][0]["logprobs"]["token_logprobs"])
        )
        < 1e-5
    )
    assert all(
        len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        for t in choice.logprobs.content
    )
    seeded = dict(model="a", messages=messages, max_completion_tokens=6, n=2, seed=4)
    first, again = (client.chat.completions.create(**seeded) for _ in range(2))
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    with pytest.raises(BadRequestError) as refused:  # OpenAI's error shape: the client reads its message
        client.chat.completions.create(model=served["model"], messages=messages, stream=True)
    assert refused.value.param == "stream" and "stream" in refused.value.message


def test_serve_run_installs_the_proxy_guard_at_the_configs_body_limit_and_says_when_it_serves(served):
    """`python -m serve.run` starts its Ray with Serve's proxy body guard (serve/proxy_guard.py)
    at the config's max_body_bytes, not the guard's 8 MiB default; a chunked body past it is cut
    at the proxy with 413 in OpenAI's shape; and the command prints one line once the application runs."""
    health = requests.get(served["url"] + "/health", timeout=30).json()
    assert health["proxy_guard"] == {"installed": True, "limit_bytes": MAX_BODY_BYTES}, health

    def chunks():  # no Content-Length: only the guard sees the size while it streams
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 2):
            yield b" " * (1 << 20)

    answer = requests.post(
        served["url"] + "/v1/completions", data=chunks(), headers={"content-type": "application/json"}, timeout=60
    )
    assert answer.status_code == 413 and "SERVE_PROXY_MAX_BODY_BYTES" in answer.json()["error"]["message"], answer.text[
        :500
    ]
    deadline = time.time() + 30
    while "serving subliminal on http://127.0.0.1:" not in served["log"].read_text():
        assert time.time() < deadline, served["log"].read_text()[-3000:]
        time.sleep(1)
