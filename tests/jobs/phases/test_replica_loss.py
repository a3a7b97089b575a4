"""A Serve replica SIGKILLed (by its pid) while the numbers and evaluation stages have chunks in flight.

The stages resend the chunks the dead replica took with it, Serve's replacement
answers them, and the results equal an undisturbed run's: the same kept rows
and counts for the numbers (requests carry their seeds), the same predictions
for the scores. The transformers engine serves here: it runs a seeded request
alone, so its completions do not depend on what else is in flight, and a
replica restarts in seconds.
"""

import os
import signal
import threading
import time

import pytest

from jobs.experiment.config import NumbersConfig
from jobs.phases.evaluate import score_models
from jobs.phases.numbers import generate_kept, number_prompts
from jobs.sources.wmdp import synthetic_questions
from serve.launch import start_service, stop_service
from serve.settings import ServiceSettings

APP = "t-loss"


@pytest.fixture(scope="module")
def handle(ray_cluster, tiny_model, lora_adapters):
    settings = ServiceSettings(engine="hf", model=tiny_model, max_model_len=256)
    # Serve asks a replica's health every 2 s (its default: 10 s): a dead replica is replaced in seconds.
    handle = start_service(
        settings, lora_adapters, name=APP, route_prefix=f"/{APP}", num_cpus=0.5, health_check_period_s=2
    )
    yield handle
    stop_service(APP)


@pytest.fixture
def replica_pid(actor_pids):
    """The pid of the app's one live replica."""

    def pid() -> int:
        pids = actor_pids(f"ServeReplica:{APP}:")
        assert len(pids) == 1, pids
        return pids[0]

    return pid


class KillingHandle:
    """The real deployment handle; the `after`-th request sent is watched, and the replica is
    SIGKILLed the moment that request is known to be in flight: routed to the replica and not yet
    answered. No timer tuned to this machine: `killed_in_flight` is set only if the kill came then."""

    def __init__(self, handle, pid: int, after: int):
        self.handle, self.pid, self.after, self.sent, self.lock = handle, pid, after, 0, threading.Lock()
        self.killed_in_flight = threading.Event()

    def _kill_when_in_flight(self, response) -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                response.result(timeout_s=0)
                return  # answered before it was seen on the replica: no kill, and the test fails
            except TimeoutError:
                # Ray 2.60's DeploymentResponse keeps its replica's result handle once the router
                # has handed the request to that replica.
                if response._replica_result is not None:
                    os.kill(self.pid, signal.SIGKILL)
                    self.killed_in_flight.set()
                    return
            time.sleep(0.002)

    def __getattr__(self, method: str):
        outer = self

        class Method:
            def remote(self, request):
                response = getattr(outer.handle, method).remote(request)
                with outer.lock:  # evaluation sends from several threads
                    outer.sent += 1
                    watch = outer.sent == outer.after
                if watch:
                    threading.Thread(target=outer._kill_when_in_flight, args=(response,), daemon=True).start()
                return response

        return Method()


@pytest.mark.timeout(600)
def test_a_killed_replica_loses_no_chunk_and_counts_none_twice(handle, replica_pid, tiny_model, capsys):
    from transformers import AutoTokenizer

    cfg = NumbersConfig(prompts=96, keep=48, max_tokens=24, seed=3, chunk=16, in_flight=3)
    prompts = number_prompts(AutoTokenizer.from_pretrained(tiny_model), cfg)
    undisturbed = generate_kept(handle, prompts, "a", cfg, "teacher")
    first = replica_pid()
    killer = KillingHandle(handle, first, after=3)
    disturbed = generate_kept(killer, prompts, "a", cfg, "teacher")
    # the kill took chunks with it
    assert killer.killed_in_flight.is_set() and "replica lost" in capsys.readouterr().out
    assert disturbed == undisturbed
    assert replica_pid() != first

    questions = [
        {"question": q["question"], "choices": q["choices"], "answer": q["answer"], "subset": q["subset"]}
        for q in synthetic_questions(32, seed=5)
    ]
    models = {"base": None, "a": "a"}
    undisturbed = score_models(handle, models, questions, chunk=32, in_flight=3)
    second = replica_pid()
    killer = KillingHandle(handle, second, after=3)
    disturbed = score_models(killer, models, questions, chunk=32, in_flight=3)
    assert killer.killed_in_flight.is_set() and "replica lost" in capsys.readouterr().out
    assert replica_pid() != second
    for name in models:
        # Scores of requests batched with others differ by float noise; the answers do not.
        assert [r["prediction"] for r in disturbed[name]] == [r["prediction"] for r in undisturbed[name]]
        for d, u in zip(disturbed[name], undisturbed[name]):
            assert d["logprobs"] == pytest.approx(u["logprobs"], abs=1e-4)
