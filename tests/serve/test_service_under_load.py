"""The service as an operator runs it, under careless and hostile clients: `serve run
serve/config.yaml` on a head node of its own started with SERVE_API_KEY set (the key is read
where the application is built, in the cluster: docs/api.md), over real HTTP.

The config is the project's own with three changes, written to a copy: a free port (the session's
Serve proxy holds 8000), `engine: hf`, so that generation and scoring both run on the
transformers engine, whose one worker thread is where a long request could once starve the
health check (and which starts in seconds, where vLLM takes a minute of the suite's budget), and
the replica holding both of the head's CPUs, so the load runs on two threads.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests
import yaml
from conftest import free_port

from jobs.sources.wmdp import synthetic_questions

ROOT = Path(__file__).resolve().parents[2]
KEY = "load-test-token-5b1e"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY_TIMEOUT_S = 3.0  # the config copy's body_timeout_s (the default, 10 s, would only make the tests wait)
pytestmark = pytest.mark.quiet  # health and a small request must stay fast under the service's own load: no one else's
NEAR_MISSES = ["", "Bearer", f"Bearer {KEY[:-1]}", f"Bearer {KEY}x", f"bearer {KEY}", KEY, f"Bearer  {KEY}"]


@pytest.fixture(scope="module")
def keyed_head():
    from conftest import head_node

    with head_node(
        env={"SERVE_API_KEY": KEY, "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": "serve.proxy_guard.middlewares"}
    ) as head:
        yield head


@pytest.fixture(scope="module")
def service(keyed_head, tiny_model, tmp_path_factory):
    """`serve run` of the config's copy on the module's head node; yields its URL and the head."""
    config = yaml.safe_load((ROOT / "serve" / "config.yaml").read_text())
    port = free_port()
    config["http_options"]["port"] = port
    config["applications"][0]["args"]["engine"] = "hf"
    config["applications"][0]["args"]["body_timeout_s"] = BODY_TIMEOUT_S
    # the head's two: torch's threads for the load
    config["applications"][0]["deployments"][0]["ray_actor_options"]["num_cpus"] = 2
    path = tmp_path_factory.mktemp("serve") / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(path.with_name("serve-run.log"), "w")  # noqa: SIM115 - open for the process's lifetime
    serve_bin = str(Path(sys.executable).parent / "serve")
    process = subprocess.Popen(
        [serve_bin, "run", str(path), "--address", keyed_head["address"]],
        cwd=ROOT,
        env={**os.environ, "RAY_AUTH_MODE": "token"},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while not healthy(url):
        assert process.poll() is None, f"serve run exited: {path.with_name('serve-run.log').read_text()[-3000:]}"
        assert time.time() < deadline, "the service did not answer /health within 300 s"
        time.sleep(1)
    yield {"url": url, "head": keyed_head}
    # Nothing here tests `serve run`'s own shutdown (SIGINT, which once took over 60 s after the stalled-connection
    # tests), and the head's teardown stops every process of the application: its process group goes at once.
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    log.close()


def healthy(url: str) -> bool:
    try:
        return requests.get(url + "/health", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def replica(head: dict) -> psutil.Process:
    """The application's one replica: a worker of this head's raylet (found by its temp dir)."""
    raylets = [
        p
        for p in psutil.process_iter(["cmdline"])
        if head["temp_dir"] in " ".join(p.info["cmdline"] or ()) and "raylet" in (p.info["cmdline"] or [""])[0]
    ]
    found = [
        c
        for r in raylets
        for c in r.children(recursive=True)
        if c.cmdline() and c.cmdline()[0].startswith("ray::ServeReplica:subliminal:")
    ]
    assert len(found) == 1, found
    return found[0]


def health_latencies(url: str, until) -> list[float]:
    """Seconds each /health took, polled every 0.25 s until `until()` (no token: the open probe)."""
    seen = []
    while not until():
        started = time.perf_counter()
        assert requests.get(url + "/health", timeout=30).status_code == 200
        seen.append(time.perf_counter() - started)
        time.sleep(0.25)
    return seen


def questions(n: int) -> list[dict]:
    rows = synthetic_questions(n_per_subset=200, seed=11)
    return (rows * (n // len(rows) + 1))[:n]


ROUTES = [
    ("post", "/generate", {"prompts": ["hi"], "max_tokens": 2}),
    ("post", "/score", {"questions": [{"question": "Q?", "choices": ["a", "b"]}]}),
    ("post", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}),
    (
        "post",
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ),
    ("get", "/v1/models", None),
    ("get", "/adapters", None),
    ("get", "/no-such-route", None),
]


def test_every_route_but_health_refuses_a_missing_or_near_miss_token(service):
    url = service["url"]
    for method, path, body in ROUTES:
        for header in [None, *NEAR_MISSES]:
            headers = {} if header is None else {"Authorization": header}
            response = requests.request(method, url + path, json=body, headers=headers, timeout=60)
            assert response.status_code == 401, (path, header, response.status_code)
            if path.startswith("/v1/"):
                assert response.json()["error"]["code"] == 401  # OpenAI's shape on OpenAI's routes
        expected = 404 if path == "/no-such-route" else 200
        assert requests.request(method, url + path, json=body, headers=AUTH, timeout=60).status_code == expected, path
    assert requests.get(url + "/health", timeout=30).json() == {"status": "ok"}  # healthy or not, no more
    assert requests.get(url + "/health", headers=AUTH, timeout=30).json()["engine"] == "hf"
    spoofed = {**AUTH, "x-subliminal-proxy-guard": "1"}  # the guard replaces a client's own mark
    assert requests.get(url + "/health", headers=spoofed, timeout=30).json()["proxy_guard"] == {
        "installed": True,
        "limit_bytes": 8 << 20,
    }


def peak_growth(process: psutil.Process, send) -> tuple[requests.Response, int]:
    """`send()`'s answer, and how far the process's peak resident memory rose above its memory before."""
    Path(f"/proc/{process.pid}/clear_refs").write_text("5")  # peak resident memory := now
    before = process.memory_info().rss
    response = send()
    peak = (
        int(
            next(
                line
                for line in Path(f"/proc/{process.pid}/status").read_text().splitlines()
                if line.startswith("VmHWM")
            ).split()[1]
        )
        << 10
    )
    return response, peak - before


@pytest.mark.parametrize("mib", [20, 200])
def test_a_chunked_body_past_the_limit_is_413_and_the_replica_does_not_hold_it(service, mib):
    """Sent chunked (a generator: no Content-Length), in 1 MiB pieces. Without the proxy's limit
    (serve/proxy_guard.py) Serve's proxy hands the whole body on: +108 MiB for 200 MiB."""
    url, headers = service["url"] + "/generate", {**AUTH, "content-type": "application/json"}
    response, grown = peak_growth(
        replica(service["head"]),
        lambda: requests.post(url, data=(b" " * (1 << 20) for _ in range(mib)), headers=headers, timeout=120),
    )
    assert response.status_code == 413 and "bytes" in response.json()["detail"], response.text
    assert grown < 20 << 20, f"the replica's peak memory grew {grown >> 20} MiB for a {mib} MiB body"
    assert requests.post(url, json={"prompts": ["hi"], "max_tokens": 2}, headers=AUTH, timeout=60).status_code == 200
    assert proxy_refusals(service["head"]) >= 1  # counted where the replica cannot: in the proxy


def proxy_refusals(head: dict) -> float:
    """The head's `ray_subliminal_serve_proxy_refused_total`, once its metrics agent exports it (up to 60 s)."""
    deadline = time.time() + 60
    while True:
        found = re.findall(
            r"^ray_subliminal_serve_proxy_refused_total\{[^}]*\} (\S+)$",
            requests.get(head["metrics"], timeout=30).text,
            re.M,
        )
        if found or time.time() > deadline:
            return sum(map(float, found))
        time.sleep(2)


def test_a_1_mb_stop_string_is_refused_naming_stop(service):
    url, stop = service["url"], "x" * (1 << 20)
    generate = requests.post(url + "/generate", json={"prompts": ["hi"], "stop": [stop]}, headers=AUTH, timeout=60)
    assert generate.status_code == 422 and generate.json()["detail"][0]["loc"][:2] == ["body", "stop"]
    openai = requests.post(
        url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "stop": stop}, headers=AUTH, timeout=60
    )
    assert openai.status_code == 400 and openai.json()["error"]["param"].startswith("stop")


def test_an_amplified_request_is_refused_and_a_heavy_one_served_while_health_answers(service):
    url = service["url"]
    amplified = {"model": "tiny", "prompt": ["1, 2, 3,"] * 64, "n": 16, "max_tokens": 400, "logprobs": 20}
    refused = requests.post(url + "/v1/completions", json=amplified, headers=AUTH, timeout=60)
    assert refused.status_code == 413 and "max_work_per_request" in refused.json()["error"]["message"], refused.text
    heavy = {
        "model": "tiny",
        "prompt": ["1, 2, 3,"] * 16,
        "n": 4,
        "max_tokens": 128,
        "logprobs": 20,
        "temperature": 1.0,
    }
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(requests.post, url + "/v1/completions", json=heavy, headers=AUTH, timeout=600)
        latencies = health_latencies(url, answer.done)
    assert answer.result().status_code == 200 and len(answer.result().json()["choices"]) == 64
    assert latencies and max(latencies) < 2, latencies


def latencies_while(url: str, until) -> dict[str, list[float]]:
    """Seconds each /health and each small /generate took, alternately, until `until()`."""
    seen = {"health": [], "generate": []}
    while not until():
        for name, send in (
            ("health", lambda: requests.get(url + "/health", timeout=60)),
            (
                "generate",
                lambda: requests.post(
                    url + "/generate", json={"prompts": ["1, 2,"], "max_tokens": 2}, headers=AUTH, timeout=60
                ),
            ),
        ):
            started = time.perf_counter()
            assert send().status_code == 200, name
            seen[name].append(time.perf_counter() - started)
        time.sleep(0.25)
    return seen


def test_an_echo_and_long_cloze_questions_leave_health_and_a_small_generate_fast(service):
    """The expensive answers to cheap requests: an echo listing 21 log-probabilities of every prompt
    token in each of 16 choices, sized before any work (the whole one refused, a smaller one served,
    its prompt's entries built and decoded once), and cloze questions whose prompts fill the context,
    their lengths checked before any is scored."""
    url, ids = service["url"], list(range(5, 505))
    # 12,000 ids: inside max_work_per_request
    amplified = {"model": "tiny", "prompt": [ids] * 24, "echo": True, "logprobs": 20, "max_tokens": 0, "n": 16}
    refused = requests.post(url + "/v1/completions", json=amplified, headers=AUTH, timeout=60)
    assert refused.status_code == 413 and "max_logprobs_per_answer" in refused.json()["error"]["message"], refused.text
    echo = {**amplified, "prompt": [ids] * 2}  # 336,000 log-probabilities
    # about 494 tokens of a context of 512; each question its own (the scorer reads a question's one-token choices,
    # and equal questions, from one forward)
    cloze = {
        "format": "cloze",
        "questions": [
            {"question": f"{i} " + " ".join(["1, 2, 3"] * 95), "choices": ["4", "5", "6", "7"], "answer": 0}
            for i in range(256)
        ],
    }
    with ThreadPoolExecutor(2) as pool:
        answers = [
            pool.submit(requests.post, url + path, json=body, headers=AUTH, timeout=600)
            for path, body in (("/v1/completions", echo), ("/score", cloze))
        ]
        seen = latencies_while(url, lambda: all(a.done() for a in answers))
    assert [a.result().status_code for a in answers] == [200, 200], [a.result().text[:300] for a in answers]
    assert len(answers[0].result().json()["choices"]) == 32 and len(answers[1].result().json()["results"]) == 256
    assert seen["health"] and max(seen["health"]) < 2 and max(seen["generate"]) < 5, seen


def test_health_stays_fast_and_the_replica_is_kept_through_eight_2048_question_scores(service):
    """Before, one job held all eight (gathered) and the health check queued behind it: all 16,384
    questions, 25-36 s of this replica's scoring on two cores, against the 2 s allowed here. (4,096 each, as
    before, took 45-50 s of the suite's quiet end and showed nothing more.)"""
    body = {
        "questions": [
            {"question": r["question"], "choices": r["choices"], "answer": r["answer"]} for r in questions(2048)
        ]
    }
    pid = replica(service["head"]).pid
    url = service["url"]
    with ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(requests.post, url + "/score", json=body, headers=AUTH, timeout=900) for _ in range(8)]
        latencies = health_latencies(url, lambda: all(a.done() for a in answers))
    assert [a.result().status_code for a in answers] == [200] * 8
    assert all(len(a.result().json()["results"]) == 2048 for a in answers)
    assert max(latencies) < 2, f"slowest /health {max(latencies):.1f} s of {len(latencies)}"
    assert replica(service["head"]).pid == pid  # never replaced: no failed health checks


def test_a_request_whose_client_leaves_stops_its_work(service):
    """A 4096-question /score abandoned after 2 s: its replica goes quiet instead of scoring on."""
    body = {"questions": [{"question": r["question"], "choices": r["choices"]} for r in questions(4096)]}
    process = replica(service["head"])
    with pytest.raises(requests.Timeout):
        requests.post(service["url"] + "/score", json=body, headers=AUTH, timeout=(5, 2))
    time.sleep(1.5)  # the cancellation reaches the replica; the step under way ends
    used = sum(process.cpu_times()[:2])
    time.sleep(3)
    busy = sum(process.cpu_times()[:2]) - used
    assert busy < 0.6, f"the replica used {busy:.1f} CPU-s in 3 s after its only client left"


def stalled_bodies(url: str, method: str, path: str, count: int, headers: dict) -> list[socket.socket]:
    """`count` connections, each sending a request's headers and the first chunk of a chunked body,
    then nothing more: what a client trickling a byte a minute looks like to the server."""
    host, port = url.removeprefix("http://").split(":")
    sockets = []
    for _ in range(count):
        conn = socket.create_connection((host, int(port)), timeout=30)
        head = [
            f"{method} {path} HTTP/1.1",
            f"Host: {host}",
            "Transfer-Encoding: chunked",
            "Content-Type: application/json",
        ]
        conn.sendall(("\r\n".join(head + [f"{k}: {v}" for k, v in headers.items()]) + "\r\n\r\n1\r\n{\r\n").encode())
        sockets.append(conn)
    return sockets


def answer_and_close(conn: socket.socket, within: float) -> tuple[bytes, float]:
    """The connection's answer (the status line on) and when the server closed it, in seconds."""
    started, data = time.perf_counter(), b""
    conn.settimeout(within)
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except TimeoutError:
        return data, float("inf")  # still open
    finally:
        conn.close()
    return data, time.perf_counter() - started


def generate_and_score_latencies(url: str) -> list[float]:
    """Seconds each of three small /generate and three /score requests took, each answered 200."""
    latencies = []
    for route, body in [
        ("/generate", {"prompts": ["hi"], "max_tokens": 2}),
        ("/score", {"questions": [{"question": "Q?", "choices": ["a", "b"]}]}),
    ] * 3:
        started = time.perf_counter()
        assert requests.post(url + route, json=body, headers=AUTH, timeout=30).status_code == 200
        latencies.append(time.perf_counter() - started)
    return latencies


def test_stalled_bodies_on_health_hold_no_slot_while_generate_and_score_answer(service):
    """64 connections to /health, each stalled inside a chunked body: /health reads no body, so
    they are answered at once and hold none of the replica's 64 ongoing-request slots (before,
    the middleware read each body and every /generate timed out behind them)."""
    url = service["url"]
    stalled = stalled_bodies(url, "GET", "/health", 64, {})
    latencies = generate_and_score_latencies(url)
    answers = [answer_and_close(conn, 30) for conn in stalled]
    assert max(latencies) < 2, latencies
    assert all(data.startswith(b"HTTP/1.1 200") for data, _ in answers), answers[0]
    assert max(closed for _, closed in answers) < 30  # none left open


def test_stalled_headers_hold_no_slot_while_generate_and_score_answer(service):
    """64 connections each stalled inside its request headers (what a slowloris client sends). No
    deadline can cut them: Serve's proxy is uvicorn, which sets none on a request's headers, and
    no middleware runs before they are whole (docs/operations.md says what to put in front). What
    holds is that they take a socket of the proxy each and none of the replica's request slots."""
    url = service["url"]
    host, port = url.removeprefix("http://").split(":")
    stalled = []
    for _ in range(64):
        conn = socket.create_connection((host, int(port)), timeout=30)
        conn.sendall(f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: app".encode())
        stalled.append(conn)
    try:
        latencies = generate_and_score_latencies(url)
        assert max(latencies) < 2, latencies
    finally:
        for conn in stalled:
            conn.close()


def test_a_stalled_body_on_generate_is_cut_at_the_deadline_with_408(service):
    url = service["url"]
    stalled = stalled_bodies(url, "POST", "/generate", 8, AUTH)
    started = time.perf_counter()
    answers = [answer_and_close(conn, 30) for conn in stalled]
    waited = time.perf_counter() - started
    assert all(data.startswith(b"HTTP/1.1 408") and b"body_timeout_s" in data for data, _ in answers), answers[0]
    assert BODY_TIMEOUT_S - 0.5 < waited < BODY_TIMEOUT_S + 10, waited  # cut at the deadline, every one closed
    assert (
        requests.post(
            url + "/generate", json={"prompts": ["hi"], "max_tokens": 2}, headers=AUTH, timeout=30
        ).status_code
        == 200
    )


def test_two_million_prompts_are_refused_before_any_tokenizing_while_health_stays_fast(service):
    """8 MB of one-character prompts (under max_body_bytes): refused by the schema's list ceiling
    (LIST_MAX) while the body is validated; before, the replica's one preparation thread tokenized
    them for minutes. A list under the ceiling but over max_prompts_per_request is refused by
    count, also before tokenizing."""
    url = service["url"]
    body = b'{"model":"tiny","max_tokens":1,"prompt":[' + b",".join([b'"a"'] * 2_000_000) + b"]}"
    assert len(body) < 8 << 20
    headers = {**AUTH, "content-type": "application/json"}
    with ThreadPoolExecutor(1) as pool:
        started = time.perf_counter()
        answer = pool.submit(requests.post, url + "/v1/completions", data=body, headers=headers, timeout=120)
        latencies = health_latencies(url, answer.done)
        took = time.perf_counter() - started
    refused = answer.result()
    assert refused.status_code == 400 and "65536" in refused.json()["error"]["message"], refused.text[:500]
    assert len(refused.content) < 10_000  # the refused list is not echoed back
    assert took < 10 and (not latencies or max(latencies) < 2), (took, latencies)
    counted = requests.post(
        url + "/v1/completions",
        json={"model": "tiny", "prompt": ["a"] * 60_000, "max_tokens": 1},
        headers=AUTH,
        timeout=60,
    )
    assert counted.status_code == 413 and "at most 1024" in counted.json()["error"]["message"], counted.text[:300]
