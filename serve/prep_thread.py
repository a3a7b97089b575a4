"""The replica's preparation thread, watched.

Tokenizing, formatting and building answers run on one thread beside the event loop (the
counting tokenizer is not thread-safe, so it has one user). A request's deadline answers 504
but cannot stop a Python thread: a job that never ends would hold the thread, every later
request with a body would queue behind it, and a health check that looked only at the engines
would stay green. So the thread records when its current job began, and `check` (called by the
replica's health check) fails once a job has outlived the request deadline: Serve then replaces
the replica instead of keeping one that can no longer answer.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor


class PreparationStuck(RuntimeError):
    """A preparation job has run past the request deadline: the replica can no longer serve."""


class PrepThread:
    def __init__(self, deadline_s: float):
        self.deadline_s = deadline_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prep")
        self._began: float | None = None  # when the running job began; None while idle

    async def run(self, fn, *args):
        """`fn(*args)` on the thread, awaited."""

        def job():
            self._began = time.monotonic()
            try:
                return fn(*args)
            finally:
                self._began = None

        return await asyncio.get_running_loop().run_in_executor(self._pool, job)

    def check(self) -> None:
        """Raises once the running job has been on the thread longer than the deadline."""
        began = self._began
        if began is not None and (elapsed := time.monotonic() - began) > self.deadline_s:
            raise PreparationStuck(
                f"the preparation thread has been on one job for {elapsed:.0f} s, past request_timeout_s ({self.deadline_s:g} s): "
                "every later request would queue behind it"
            )

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
