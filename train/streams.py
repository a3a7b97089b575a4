"""A training job's batches from its Ray Data shard, and the next job's stream started ahead.

A run of several jobs (train/loop.py) trains them one after another; each job
reads a dataset of its own, whose stream Ray Data starts when the job first
asks for a batch: about 2 s a job on 2 CPUs (BENCHMARKS.md, "The pipeline's
overhead"), most of a small job's start. `Streams` starts the first job's
first pass in a thread while the base model loads, and each next job's while
the job before it trains, so its first batch is waiting; every worker does the
same, so each stream's split starts on all of them. The batches are those a
stream started on time would give, in order.
"""

from __future__ import annotations

import itertools
import threading


def shard_name(job) -> str:
    """The dataset this worker reads `job`'s rows from: its own part of rows cut per worker, or its
    split of a dataset Ray Data streams (train.ray_run.job_datasets)."""
    import ray.train

    return f"{job.name}@{ray.train.get_context().get_world_rank()}" if job.split_by_rank else job.name


class Stream:
    """One job's batches from its dataset shard. Its first pass can be started ahead (`start`): a
    thread asks for its first batch while the job before it trains, so Ray Data's start of the
    stream (about 2 s a job on 2 CPUs: BENCHMARKS.md, "The pipeline's overhead") is not waited for."""

    def __init__(self, job, pad_id: int, one_row: bool):  # job: a train.worker_job.WorkerJob
        import ray.train

        from train.collate import PackBatch

        self.shard, self.batch_size = ray.train.get_dataset_shard(shard_name(job)), job.cfg.batch_size
        self.collate = PackBatch(job.cfg.pack_length or job.cfg.max_length, pad_id, one_row)
        self.ahead: threading.Thread | None = None

    def new_pass(self):
        return self.shard.iter_torch_batches(batch_size=self.batch_size, collate_fn=self.collate, drop_last=True)

    def start(self) -> Stream:
        self.first_pass, self.first, self.error = iter(self.new_pass()), [], None
        self.ahead = threading.Thread(target=self._fetch_first, daemon=True, name="next job's first batch")
        self.ahead.start()
        return self

    def _fetch_first(self) -> None:
        try:
            self.first.append(next(self.first_pass))
        except StopIteration:
            pass
        except BaseException as err:  # raised in the worker's own thread when the job begins
            self.error = err

    def passes(self):
        """An iterable of the job's batches per pass over its shard; the first the one started ahead."""
        if self.ahead is None:
            return self.new_pass()
        self.ahead.join()
        self.ahead = None
        if self.error is not None:
            raise self.error
        return itertools.chain(self.first, self.first_pass)


class Streams:
    """The run's job streams: the one a job trains from, and the next job's, started ahead."""

    def __init__(self, pad_id: int, one_row: bool):
        self.pad_id, self.one_row, self.started = pad_id, one_row, {}

    def of(self, job) -> Stream:
        return self.started.pop(job.name, None) or Stream(job, self.pad_id, self.one_row)

    def start_ahead(self, job) -> None:
        if job is not None:
            self.started[job.name] = Stream(job, self.pad_id, self.one_row).start()
