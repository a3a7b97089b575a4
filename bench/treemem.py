"""Peak memory of a command's whole process tree (Ray and vLLM run many processes).

    python bench/treemem.py -- python jobs/pipeline.py --run-dir /tmp/bench-pipeline --fresh

`/usr/bin/time` reports only the largest single process. This samples every
process under the command twice a second and prints the peak of the summed PSS
(proportional set size: shared pages split among their users, so the sum does
not count a shared library once per process) and of the summed RSS. Processes
that Ray starts outside the tree (a cluster the command joins) are not counted.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import psutil


def tree_memory(root: psutil.Process) -> tuple[int, int, int]:
    """(PSS bytes, RSS bytes, processes) summed over `root` and all its descendants now."""
    pss = rss = count = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            info = proc.memory_full_info()
            pss, rss, count = pss + getattr(info, "pss", info.rss), rss + info.rss, count + 1
    return pss, rss, count


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    child = subprocess.Popen(args)
    root, peak = psutil.Process(child.pid), (0, 0, 0)
    while child.poll() is None:
        now = tree_memory(root)
        peak = tuple(map(max, peak, now))  # each figure at its own peak
        time.sleep(0.5)
    gib = 2**30
    print(
        f"[treemem] peak PSS {peak[0] / gib:.2f} GiB, RSS {peak[1] / gib:.2f} GiB, {peak[2]} processes; exit {child.returncode}",
        flush=True,
    )
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
