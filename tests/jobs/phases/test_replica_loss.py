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
    handle = start_service(ServiceSettings(engine="hf", model=tiny_model, max_model_len=256), lora_adapters, name=APP, route_prefix=f"/{APP}", num_cpus=0.5)
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
    """The real deployment handle; once `after` requests are sent, the replica is SIGKILLed `delay`
    seconds later, while those requests are still in flight: `delay` must be well under the time
    the replica takes to answer them (else the kill hits an idle replica and takes nothing with it)."""

    def __init__(self, handle, pid: int, after: int, delay: float):
        self.handle, self.pid, self.after, self.delay, self.sent = handle, pid, after, delay, 0

    def __getattr__(self, method: str):
        outer = self

        class Method:
            def remote(self, request):
                response = getattr(outer.handle, method).remote(request)
                outer.sent += 1
                if outer.sent == outer.after:
                    threading.Timer(outer.delay, os.kill, (outer.pid, signal.SIGKILL)).start()
                return response

        return Method()


@pytest.mark.timeout(600)
def test_a_killed_replica_loses_no_chunk_and_counts_none_twice(handle, replica_pid, tiny_model, capsys):
    from transformers import AutoTokenizer

    cfg = NumbersConfig(prompts=96, keep=48, max_tokens=24, seed=3, chunk=16, in_flight=3)
    prompts = number_prompts(AutoTokenizer.from_pretrained(tiny_model), cfg)
    undisturbed = generate_kept(handle, prompts, "a", cfg, "teacher")
    first = replica_pid()
    disturbed = generate_kept(KillingHandle(handle, first, after=3, delay=0.2), prompts, "a", cfg, "teacher")  # a chunk: seconds
    assert "replica lost" in capsys.readouterr().out  # the kill did take chunks with it
    assert disturbed == undisturbed
    assert replica_pid() != first

    # Chunks of 32 questions take ~0.2 s each here (chunks of 4 took ~25 ms: a kill 0.2 s after
    # the third was sent once found all three answered and took nothing with it).
    questions = [{"question": q["question"], "choices": q["choices"], "answer": q["answer"], "subset": q["subset"]} for q in synthetic_questions(32, seed=5)]
    models = {"base": None, "a": "a"}
    undisturbed = score_models(handle, models, questions, chunk=32, in_flight=3)
    second = replica_pid()
    disturbed = score_models(KillingHandle(handle, second, after=3, delay=0.05), models, questions, chunk=32, in_flight=3)
    assert "replica lost" in capsys.readouterr().out
    assert replica_pid() != second
    for name in models:
        # Scores of requests batched with others differ by float noise; the answers do not.
        assert [r["prediction"] for r in disturbed[name]] == [r["prediction"] for r in undisturbed[name]]
        for d, u in zip(disturbed[name], undisturbed[name]):
            assert d["logprobs"] == pytest.approx(u["logprobs"], abs=1e-4)
