"""The replica's preparation thread fails its check once a job outlives the deadline, and only then."""

from __future__ import annotations

import asyncio
import threading

import pytest

from serve.prep_thread import PreparationStuck, PrepThread


def test_a_job_past_the_deadline_fails_the_check_and_a_finished_one_clears_it():
    async def scenario():
        prep = PrepThread(deadline_s=0.3)
        release = threading.Event()
        assert await prep.run(sum, [1, 2, 3]) == 6
        prep.check()  # idle: healthy
        stuck = asyncio.ensure_future(prep.run(release.wait))
        await asyncio.sleep(0.1)
        prep.check()  # running, within the deadline: healthy
        await asyncio.sleep(0.4)
        with pytest.raises(PreparationStuck, match="request_timeout_s"):
            prep.check()
        release.set()
        await stuck
        prep.check()  # the job ended: healthy again
        prep.shutdown()

    asyncio.run(scenario())
