"""Soak: the inference service under mixed traffic for a long while, bad requests included.

    python bench/soak.py [--minutes 10] [--clients 32] [--engine vllm] [--out soak.json]

Starts a local Ray cluster and the service on the tiny model (one LoRA adapter
registered), then `--clients` threads send, for `--minutes`, a mix of
/generate, /score and /v1/completions requests over HTTP, base model and
adapter, about one in eight of them bad (a negative temperature, an unknown
adapter, a body over the size limit, malformed JSON, a non-finite number, a
wrong type). Reports:

- 5xx responses (target 0) and bad requests that did not get a 4xx (target 0);
- p50/p99 latency per route for the good requests;
- the service's memory: PSS summed over its processes (the replica, its
  engine-core child, Serve's proxy and controller; also by part) at the start
  (after a warm-up) and at the end (target: growth under 10%), sampled every 30 s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests
from bench_common import mc_questions, number_rows, tiny_model

URL = "http://127.0.0.1:8000/soak"


SERVICE_ACTORS = {"replica": "ServeReplica:soak:", "proxy": "ProxyActor", "controller": "ServeController"}


def service_pss() -> dict[str, int]:
    """PSS bytes of the service's processes by part: Serve's replica (its engine-core child counted
    apart as "engine"), proxy and controller."""
    from ray._private.state import actors

    parts = dict.fromkeys([*SERVICE_ACTORS, "engine"], 0)
    for actor in actors(actor_state_name="ALIVE").values():
        part = next((p for p, prefix in SERVICE_ACTORS.items() if actor["ActorClassName"].startswith(prefix)), None)
        if part is None:
            continue
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(actor["Pid"])
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    parts["engine" if proc.pid != root.pid and part == "replica" else part] += (
                        proc.memory_full_info().pss
                    )
    return parts


def requests_mix(rng: random.Random, prompts: list[str], questions: list[dict], body_limit: int, base: str):
    """(route, body or raw bytes, expect_4xx) for one request; `base` is the base model's id."""
    adapter = rng.choice([None, "a"])
    kind = rng.random()
    if kind < 0.125:  # bad
        bad = rng.choice(["temperature", "adapter", "size", "json", "nan", "type"])
        if bad == "temperature":
            return "/generate", {"prompts": [rng.choice(prompts)], "temperature": -1}, True
        if bad == "adapter":
            return "/score", {"questions": [rng.choice(questions)], "adapter": "no-such-adapter"}, True
        if bad == "size":
            return "/generate", {"prompts": ["1, " * (body_limit // 3)]}, True
        if bad == "json":
            return "/generate", b'{"prompts": ["1, 2, 3"', True
        if bad == "nan":
            return "/v1/completions", b'{"model": "%s", "prompt": "1, 2", "temperature": NaN}' % base.encode(), True
        return "/score", {"questions": "not a list"}, True
    if kind < 0.5:
        body = {"prompts": rng.sample(prompts, rng.randint(1, 4)), "max_tokens": 16, "adapter": adapter}
        if rng.random() < 0.5:
            body["seed"] = rng.randint(0, 1000)
        return "/generate", body, False
    if kind < 0.8:
        return "/score", {"questions": rng.sample(questions, rng.randint(1, 8)), "adapter": adapter}, False
    return (
        "/v1/completions",
        {"model": adapter or base, "prompt": rng.choice(prompts), "max_tokens": 16, "n": rng.randint(1, 2)},
        False,
    )


def client(seed: int, until: float, mix: dict, log: list, lock: threading.Lock) -> None:
    rng, session = random.Random(seed), requests.Session()
    while time.time() < until:
        route, body, bad = requests_mix(rng, **mix)
        started = time.perf_counter()
        try:
            if isinstance(body, bytes):
                response = session.post(
                    URL + route, data=body, headers={"content-type": "application/json"}, timeout=300
                )
            else:
                response = session.post(URL + route, json=body, timeout=300)
            status = response.status_code
        except requests.RequestException as error:  # the service dropped the connection: worse than a 5xx
            status = f"connection: {type(error).__name__}"
        with lock:
            log.append((route, bad, status, time.perf_counter() - started))


def total(parts: dict[str, int]) -> int:
    return sum(parts.values())


def gib(parts: dict[str, int]) -> dict[str, float]:
    return {"total": round(total(parts) / 2**30, 3)} | {part: round(pss / 2**30, 3) for part, pss in parts.items()}


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import ray

    from jobs.sources.tiny_model import random_lora_adapter
    from serve.launch import start_service, stop_service
    from serve.settings import ServiceSettings

    model = tiny_model()
    adapter = random_lora_adapter(model, Path(tempfile.mkdtemp()) / "a", seed=0)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    settings = ServiceSettings(model=model, engine=args.engine, max_model_len=256, kv_cache_gib=0.5)
    start_service(settings, {"a": str(adapter)}, name="soak", route_prefix="/soak", num_cpus=1)
    base = requests.get(URL + "/v1/models", timeout=60).json()["data"][0]["id"]
    mix = {
        "prompts": [r["prompt"] for r in number_rows(200)],
        "questions": mc_questions(200),
        "body_limit": settings.max_body_bytes,
        "base": base,
    }

    def run_clients(until: float, log: list) -> list[threading.Thread]:
        threads = [threading.Thread(target=client, args=(i, until, mix, log, lock)) for i in range(args.clients)]
        for thread in threads:
            thread.start()
        return threads

    log: list = []
    lock = threading.Lock()
    # warm-up: first compiled paths and allocator growth are not a leak
    for thread in run_clients(time.time() + 30, []):
        thread.join()
    memory = [(0.0, service_pss())]
    started = time.time()
    until = started + args.minutes * 60
    threads = run_clients(until, log)
    while any(t.is_alive() for t in threads):
        time.sleep(min(30, max(until - time.time(), 1)))
        memory.append((round(time.time() - started), service_pss()))
    healthy = requests.get(URL + "/health", timeout=60).status_code
    stop_service("soak")

    good = [entry for entry in log if not entry[1]]
    routes = sorted({route for route, *_ in good})
    result = {
        "minutes": args.minutes,
        "clients": args.clients,
        "engine": args.engine,
        "requests": len(log),
        "bad_requests": sum(bad for _, bad, _, _ in log),
        "status_5xx": sum(isinstance(s, int) and s >= 500 for _, _, s, _ in log),
        "connection_errors": sum(isinstance(s, str) for _, _, s, _ in log),
        "bad_not_4xx": sum(bad and not (isinstance(s, int) and 400 <= s < 500) for _, bad, s, _ in log),
        "good_not_200": sum(not bad and s != 200 for _, bad, s, _ in log),
        "latency_s": {
            r: {
                "p50": round(percentile([t for rr, _, s, t in good if rr == r and s == 200], 50), 3),
                "p99": round(percentile([t for rr, _, s, t in good if rr == r and s == 200], 99), 3),
            }
            for r in routes
        },
        "requests_per_s": round(len(log) / (args.minutes * 60), 1),
        "service_pss_gib": {
            "start": gib(memory[0][1]),
            "end": gib(memory[-1][1]),
            "growth": round(total(memory[-1][1]) / total(memory[0][1]) - 1, 4),
            "series": [(t, round(total(m) / 2**30, 3)) for t, m in memory],
        },
        "health_after": healthy,
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
