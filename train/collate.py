"""`pack_batch` as Ray Data's collate class, for the workers' `iter_torch_batches`.

Ray 2.47 deprecated a plain function as `collate_fn` (it warns in every
worker); a `NumpyBatchCollateFn` gets the same numpy batches. A module of its
own, so that importing train.loop or train.step (bench/gpu_check.py does, on a machine
without Ray) does not import Ray Data.
"""

from __future__ import annotations

from ray.data.collate_fn import NumpyBatchCollateFn

from train.data import pack_batch


class PackBatch(NumpyBatchCollateFn):
    """Packs each batch of token rows (train.data.pack_batch)."""

    def __init__(self, max_length: int, pad_id: int, one_row: bool):
        self.max_length, self.pad_id, self.one_row = max_length, pad_id, one_row

    def __call__(self, batch: dict) -> dict:
        return pack_batch(batch, max_length=self.max_length, pad_id=self.pad_id, one_row=self.one_row)
