"""The transformers engine's work as bounded jobs on its one worker thread (serve/hf_engine.py):
health is a liveness signal, never a job queued behind the work; a call whose request goes away
stops at its next step; an adapter removed under a request is a clear error.

On the real engine and the tiny model, in this process (no Ray): what the service builds on.
tests/serve/test_service_under_load.py checks the same promises over HTTP.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from serve.engine import EngineUnavailable, Sampling, UnknownAdapter
from serve.settings import ServiceSettings


@pytest.fixture(scope="module")
def engine(tiny_model):
    from serve.hf_engine import HFEngine

    engine = HFEngine(tiny_model, ServiceSettings(engine="hf", model=tiny_model, max_model_len=256, hf_batch_size=8))
    yield engine
    engine.shutdown()


@pytest.fixture
def forwards(engine):
    """How many forwards the model has run (a hook on the real model), as a callable."""
    count = [0]
    hook = engine.model.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    yield lambda: count[0]
    hook.remove()


LONG = Sampling(max_tokens=200, temperature=1.0, seed=0)  # tiny model: rarely ends early at temperature 1


def test_health_passes_while_busy_and_fails_only_when_one_step_stalls(engine):
    async def main():
        busy = asyncio.create_task(engine.generate(["1, 2, 3,"] * 32, LONG, None))
        while engine._step_began is None:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(engine.check_health(), 0.5)  # busy is healthy, and answered at once
        busy.cancel()
        release, stall_s = threading.Event(), engine.stall_s
        engine.stall_s = 0.2
        try:
            hung = asyncio.create_task(engine._run(lambda pulse: release.wait(30)))  # one step that does not end
            await asyncio.sleep(0.5)
            with pytest.raises(EngineUnavailable, match="hf_stall_s"):
                await engine.check_health()
            release.set()
            await hung
            await engine.check_health()
        finally:
            engine.stall_s = stall_s
            release.set()

    asyncio.run(main())


def test_a_cancelled_call_stops_at_its_next_step_and_the_next_call_runs(engine, forwards):
    """4 chunks x 200 steps asked; cancelled after its first forwards, the call runs no more of them."""
    prompts = ["1, 2, 3,"] * 32

    async def main():
        call = asyncio.create_task(engine.generate(prompts, LONG, None))
        while forwards() < 3:
            await asyncio.sleep(0.005)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        stopped_at = forwards()
        short = await engine.generate(["hello"], Sampling(max_tokens=2, temperature=0.0), None)
        return stopped_at, short

    stopped_at, short = asyncio.run(main())
    assert len(short) == 1 and forwards() <= stopped_at + 1 + 2  # the step under way, then the short call's own
    assert stopped_at < 20, stopped_at  # of the ~800 the whole call would run


def test_calls_take_turns_chunk_by_chunk(engine):
    """A short request sent while a long one runs finishes before it: the long one's chunks are
    separate jobs, and the short one's job runs between them."""

    async def main():
        finished = []

        async def timed(name, coro):
            await coro
            finished.append(name)

        long = asyncio.create_task(
            timed("long", engine.generate(["1, 2, 3,"] * 64, Sampling(max_tokens=40, temperature=0.0), None))
        )
        await asyncio.sleep(0.05)
        await timed("short", engine.generate(["hello"], Sampling(max_tokens=2, temperature=0.0), None))
        await long
        return finished

    assert asyncio.run(main()) == ["short", "long"]


def test_an_adapter_removed_under_a_request_is_an_unknown_adapter(engine, lora_adapters):
    async def main():
        await engine.add_adapter("gone", lora_adapters["a"])
        assert (await engine.generate(["hi"], Sampling(max_tokens=2, temperature=0.0), "gone"))[0].finish_reason in {
            "stop",
            "length",
        }
        await engine.remove_adapter("gone")
        with pytest.raises(UnknownAdapter):
            await engine.generate(["hi"], Sampling(max_tokens=2, temperature=0.0), "gone")
        with pytest.raises(UnknownAdapter):
            await engine.score(["Q? A. x B. y\nAnswer:"], [2], "gone")

    asyncio.run(main())


def test_a_request_past_request_timeout_s_is_a_504_and_its_work_stops(ray_cluster, tiny_model):
    """The service's own class (no Serve: its methods are what routes and handles call), one
    second allowed: a 512-prompt x 400-token /generate is stopped and the engine goes idle (64 prompts
    stopped at their end of text in 0.6 s on an idle 2-core machine, inside the second: no 504)."""
    from fastapi import HTTPException

    from serve.app import InferenceService
    from serve.schemas import GenerateRequest

    settings = ServiceSettings(
        engine="hf", model=tiny_model, max_model_len=512, hf_batch_size=16, request_timeout_s=1.0
    )
    service_class = InferenceService.func_or_class.__mro__[1]  # the class under Serve's ingress wrapper
    service = service_class(settings.model_dump())

    async def main():
        request = GenerateRequest(prompts=["1, 2, 3,"] * 512, max_tokens=400, temperature=1.0, seed=0)
        with pytest.raises(HTTPException) as stopped:
            await service.generate(request)
        await asyncio.sleep(1.0)  # the step under way ends
        return stopped.value

    stopped = asyncio.run(main())
    assert stopped.status_code == 504 and "request_timeout_s (1 s)" in stopped.detail
    assert service.engine._step_began is None  # idle: no chunk of the request kept running
    service.__del__()
