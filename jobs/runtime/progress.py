"""Progress lines that keep a job log short: the first, then at most one every `every_s` seconds, and the last.

A stage that finishes a chunk every second would otherwise print a line per
chunk (the numbers stage of the tiny preset printed 123, the evaluation 80);
a line every 20 seconds still shows the counts and rates moving.
"""

from __future__ import annotations

import sys
import threading
import time

EVERY_S = 20.0
WRITING = threading.Lock()  # one line at a time, whole: several stages' threads print at once


class ProgressLine:
    """Prints the lines it is given, the first, the last (`final=True`) and one per `every_s` between.
    Safe to call from several threads."""

    def __init__(self, every_s: float = EVERY_S):
        self.every_s, self.last, self.lock = every_s, None, threading.Lock()

    def print(self, line: str, final: bool = False) -> bool:
        """Print `line` if it is due; returns whether it was printed."""
        with self.lock:
            now = time.monotonic()
            if not (final or self.last is None or now - self.last >= self.every_s):
                return False
            self.last = now
        with WRITING:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        return True
