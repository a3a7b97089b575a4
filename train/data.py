"""Training data: validate `{prompt, completion}` rows, tokenize them once, pack them.

The path of a row: the driver validates the input (a JSONL/parquet file or a Ray
Dataset) and hashes its content; every row is formatted and tokenized in ONE
batched pass (labels -100 on prompt tokens), shuffled with a fixed seed and
written as parquet to a cache keyed by (tokenizer, max length, too-long policy,
seed, data hash). A file of up to IN_PROCESS_ROWS rows is tokenized in the
calling process; a larger one, or a Ray Dataset, by Ray Data's `map_batches`.
Train workers stream their shard of that cache and `pack_batch` packs each batch
into as few sequences as fit `max_length`, with position ids restarting per row
so no row attends to another.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from common.atomic import atomic_dir
from common.files import DataError, read_jsonl
from common.model_source import load_pretrained

FORMAT_VERSION = 2  # bump when tokenization output changes (2: small files shuffled in-process)
# Up to this many rows a file is tokenized in the calling process: Ray Data's start-up (an
# actor, a shuffle, a parquet write and read-back) cost 7-10 s per 1,000-row dataset on
# 2 cores, where the same transform in-process takes a fraction of a second; Ray Data's
# one pass overtakes the in-process transform only past about 100k rows (BENCHMARKS.md).
IN_PROCESS_ROWS = 100_000
OK, TRUNCATED, DROPPED = 0, 1, 2
TEACHER_COLUMN = "teacher_logprobs"  # logit_kl targets, float16 bytes per row (train.distill.teacher_targets)


def _check_row(row: dict, where: str) -> None:
    for key in ("prompt", "completion"):
        if not isinstance(row.get(key), str):
            raise DataError(f"{where}: field {key!r} is missing or not a string")
    if not row["completion"]:
        raise DataError(f"{where}: 'completion' is empty")


def read_rows(path: Path):
    """Read and check every row of a JSONL or parquet file; return (arrow table, content hash).

    The driver reads the file itself so that an error can name the line, and so
    that text columns stay text (a JSON reader that infers types would turn a
    completion like "123" into a number).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DataError(f"training data file {path} does not exist")
    rows = []
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        missing = {"prompt", "completion"} - set(table.column_names)
        if missing:
            raise DataError(f"{path}: no column {sorted(missing)[0]!r} (columns: {table.column_names})")
        rows = table.select(["prompt", "completion"]).to_pylist()
        for n, row in enumerate(rows, 1):
            _check_row(row, f"{path} row {n}")
    else:
        for line_no, row in read_jsonl(path, DataError):
            if not isinstance(row, dict):
                raise DataError(f"{path} line {line_no}: expected an object")
            _check_row(row, f"{path} line {line_no}")
            rows.append({"prompt": row["prompt"], "completion": row["completion"]})
    if not rows:
        raise DataError(f"training data file {path} holds no rows")
    table = pa.Table.from_pylist(rows, schema=pa.schema([("prompt", pa.string()), ("completion", pa.string())]))
    return table, hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_batch(batch: dict) -> dict:
    h = hashlib.sha256()
    for prompt, completion in zip(batch["prompt"], batch["completion"]):
        if not isinstance(prompt, str) or not isinstance(completion, str) or not completion:
            raise DataError(f"row with prompt {str(prompt)[:60]!r}: prompt and completion must be non-empty strings")
        h.update(f"{len(prompt)}:{prompt}{len(completion)}:{completion}".encode())
    return {"digest": [h.hexdigest()], "rows": [len(batch["prompt"])]}


def validate_dataset(ds) -> tuple[int, str]:
    """Check a Ray Dataset's rows and hash its content in order (one light pass)."""
    missing = {"prompt", "completion"} - set(ds.schema().names)
    if missing:
        raise DataError(f"dataset has no column {sorted(missing)[0]!r}")
    parts = ds.select_columns(["prompt", "completion"]).map_batches(_digest_batch, batch_size=4096).take_all()
    n = sum(p["rows"] for p in parts)
    if n == 0:
        raise DataError("training dataset holds no rows")
    return n, hashlib.sha256("".join(p["digest"] for p in parts).encode()).hexdigest()


def tokenizer_hash(model_path: str) -> str:
    """Hash of the tokenizer files, so a changed tokenizer never reuses a stale cache."""
    h = hashlib.sha256()
    if not Path(model_path).is_dir():  # a hub id: its name, with its commit when pinned (`org/name@<commit>`)
        h.update(model_path.encode())
        return h.hexdigest()
    for name in sorted(os.listdir(model_path)):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            h.update(name.encode() + (Path(model_path) / name).read_bytes())
    return h.hexdigest()


def same_tokenizer(a: str, b: str) -> bool:
    """Whether two models' tokenizers map every token string to the same id (and have the same
    specials): what logit_kl across bases needs. Not their files' bytes, which a re-save changes."""
    from transformers import AutoTokenizer

    ta, tb = load_pretrained(AutoTokenizer, a), load_pretrained(AutoTokenizer, b)
    return ta.get_vocab() == tb.get_vocab() and ta.all_special_tokens == tb.all_special_tokens


class Tokenize:
    """Ray Data batch transform: prompt + completion -> input_ids, labels, status.

    Token ids are the tokenizer's on the concatenated text (so merges across the
    boundary stay what the model sees at inference); a token is a label iff it
    covers a completion character. EOS is appended and learned.
    """

    def __init__(self, model_path: str, max_length: int, too_long: str):
        from transformers import AutoTokenizer

        self.tok = load_pretrained(AutoTokenizer, model_path)
        self.max_length = max_length
        self.too_long = too_long

    def __call__(self, batch: dict) -> dict:
        import pyarrow as pa

        prompts, completions = list(batch["prompt"]), list(batch["completion"])
        enc = self.tok([p + c for p, c in zip(prompts, completions)], return_offsets_mapping=True)
        eos = self.tok.eos_token_id
        all_ids, all_labels, status = [], [], []
        for ids, offsets, prompt in zip(enc["input_ids"], enc["offset_mapping"], prompts):
            cut = len(prompt)
            labels = [t if end > cut else -100 for t, (_, end) in zip(ids, offsets)]
            if ids[-1] != eos:
                ids, labels = ids + [eos], labels + [eos]
            state = OK
            if len(ids) > self.max_length:
                n_prompt = sum(1 for label in labels if label == -100)
                keep_prompt = self.max_length - (len(ids) - n_prompt)
                n_special = 1 if ids[0] == self.tok.bos_token_id else 0
                if self.too_long == "drop" or keep_prompt <= n_special:
                    ids, labels, state = [], [], DROPPED
                else:  # keep BOS, cut prompt tokens from the left
                    drop = len(ids) - self.max_length
                    ids = ids[:n_special] + ids[n_special + drop :]
                    labels = labels[:n_special] + labels[n_special + drop :]
                    state = TRUNCATED
            all_ids.append(ids)
            all_labels.append(labels)
            status.append(state)
        return pa.table(
            {
                "input_ids": pa.array(all_ids, type=pa.list_(pa.int32())),
                "labels": pa.array(all_labels, type=pa.list_(pa.int32())),
                "status": pa.array(status, type=pa.int8()),
            }
        )


FOOTER_READERS = "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS"


def stats_actor_on_this_node() -> None:
    """Ray Data's stats actor made now, from this process (call it from the driver, after ray.init).

    It is one detached, 0-CPU actor per cluster, placed on the node of the first process that runs
    a dataset and never ended. Left to a training worker, it sits on a worker node, which then never
    counts as idle: an autoscaler keeps that node (a GPU node on a real cluster) up for as long as the
    cluster runs (found with bench/autoscale.py). Made by the driver, it lives on the driver's node.
    """
    from ray.data._internal.stats import get_or_create_stats_actor  # Ray 2.60's only way to place it

    get_or_create_stats_actor()


def read_parquet(path: str | Path):
    """`ray.data.read_parquet` with one footer-reading actor instead of Ray Data 2.60's 32.

    Ray Data lists a read's files through a pool of actors that it creates for each read and
    kills once the listing is done. For the few local files of a tokenized cache, most were
    killed before they had started, and the dashboard counted each as a failed task: 153 of the
    554 tasks of a successful tiny run. One reader lists a handful of files, and three reads took
    2.6 s instead of 3.7 s here. The count is read from the environment of the process that
    executes the read: the driver, for the datasets this project materializes (job_dataset)."""
    import ray.data

    os.environ.setdefault(FOOTER_READERS, "1")
    return ray.data.read_parquet(str(path))


def tokenize_to_cache(source, model_path: str, max_length: int, too_long: str, seed: int, cache_dir: Path) -> dict:
    """Tokenize `source` (file path or Ray Dataset) into the parquet cache, once.

    Returns {path, rows, truncated, dropped, cached}. The cache entry is written to
    a temporary folder and renamed into place, so a crash never leaves a partial one.
    """

    table = None
    if isinstance(source, (str, Path)):
        table, data_hash = read_rows(Path(source))
        n_rows = table.num_rows
    else:
        n_rows, data_hash = validate_dataset(source)
    key_src = json.dumps([FORMAT_VERSION, tokenizer_hash(model_path), max_length, too_long, seed, data_hash])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    out = Path(cache_dir) / "tokenized" / key
    stats_file = out / "_stats.json"
    if stats_file.is_file():
        return {**json.loads(stats_file.read_text()), "path": str(out), "cached": True}

    try:
        with atomic_dir(out) as tmp:
            tokenize_args = (model_path, max_length, too_long)
            if table is not None and n_rows <= IN_PROCESS_ROWS:
                status = _tokenize_in_process(table, tokenize_args, seed, tmp)
            else:
                status = _tokenize_with_ray_data(source if table is None else table, tokenize_args, seed, tmp)
            stats = {
                "rows": n_rows,
                "truncated": int((status == TRUNCATED).sum()),
                "dropped": int((status == DROPPED).sum()),
            }
            if stats["dropped"] == n_rows:
                raise DataError(f"all {n_rows} rows are longer than max_length={max_length} and were dropped")
            (tmp / "_stats.json").write_text(json.dumps(stats))  # inside the folder that is renamed in whole
    except FileExistsError:
        if not stats_file.is_file():
            raise
        # Another process wrote the same entry (same key: same content) first; use it.
    return {**stats, "path": str(out), "cached": False}


def _tokenize_with_ray_data(rows, tokenize_args: tuple, seed: int, out: Path) -> np.ndarray:
    """One `map_batches` pass of `Tokenize` over `rows` (a Ray Dataset or an arrow table), Ray
    Data's seeded shuffle, parquet shards in `out`. Returns the rows' status column."""
    import ray.data

    ds = rows if isinstance(rows, ray.data.Dataset) else ray.data.from_arrow(rows)
    tokenized = (
        ds.select_columns(["prompt", "completion"])
        .map_batches(
            Tokenize, fn_constructor_args=tokenize_args, batch_size=512, compute=ray.data.ActorPoolStrategy(size=1)
        )
        .random_shuffle(seed=seed)
    )
    tokenized.write_parquet(str(out))
    return read_parquet(out).select_columns(["status"]).to_pandas()["status"].to_numpy()


def _tokenize_in_process(table, tokenize_args: tuple, seed: int, out: Path) -> np.ndarray:
    """The same pass over a small table, in this process: tokenized in batches of 512, rows
    permuted by `seed` (numpy's, not Ray Data's order), one parquet file in `out`. Returns the
    rows' status column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokenize = Tokenize(*tokenize_args)
    parts = [
        tokenize(batch.to_pydict()) for batch in table.select(["prompt", "completion"]).to_batches(max_chunksize=512)
    ]
    tokens = pa.concat_tables(parts)
    tokens = tokens.take(np.random.default_rng(seed).permutation(tokens.num_rows))
    pq.write_table(tokens, out / "part-0.parquet")
    return tokens.column("status").to_numpy()


def completion_positions(labels) -> np.ndarray:
    """Positions p of a row whose logits predict a label (labels[p + 1] set): where logit_kl's KL is taken."""
    labels = np.asarray(labels)
    return np.nonzero(labels[1:] != -100)[0]


def pack_batch(batch: dict, max_length: int, pad_id: int, one_row: bool = False) -> dict:
    """Pack a batch of token rows into [n, L] tensors, L <= max_length (or, with `one_row`,
    into a single padding-free row of every token).

    position_ids restart at 0 for every row (and for the padding tail), which is
    how transformers keeps packed rows from attending to each other: SDPA and eager
    build a block-diagonal mask from them at any batch size, flash attention turns
    them into sequence boundaries only in a batch of one row (train.model.packs_into_one_row).
    Returns input_ids, labels, position_ids and the real/total token counts; for rows that carry
    the teacher's targets (TEACHER_COLUMN), those too, one row per completion position in the
    order the packed batch holds them.
    """
    import torch

    targets = batch.get(TEACHER_COLUMN, [None] * len(batch["input_ids"]))
    rows = [row for row in zip(batch["input_ids"], batch["labels"], targets) if len(row[0])]
    rows.sort(key=lambda r: -len(r[0]))
    real = sum(len(r[0]) for r in rows)
    if one_row:
        max_length = max(real, 1)
    # As many sequences as the tokens need; each row (longest first) goes to the
    # least-filled sequence it fits in, so sequences end up nearly equally long.
    n_bins = max(1, -(-real // max_length))
    bins: list[list] = [[] for _ in range(n_bins)]
    fill = [0] * n_bins
    for row in rows:
        fits = [i for i in range(len(bins)) if fill[i] + len(row[0]) <= max_length]
        if not fits:
            bins.append([])
            fill.append(0)
            fits = [len(bins) - 1]
        i = min(fits, key=fill.__getitem__)
        bins[i].append(row)
        fill[i] += len(row[0])
    width = max(max(fill), 1)
    input_ids = torch.full((len(bins), width), pad_id, dtype=torch.long)
    labels = torch.full_like(input_ids, -100)
    position_ids = torch.zeros_like(input_ids)
    for b, members in enumerate(bins):
        start = 0
        for ids, row_labels, _ in members:
            n = len(ids)
            input_ids[b, start : start + n] = torch.as_tensor(np.asarray(ids, dtype=np.int64))
            labels[b, start : start + n] = torch.as_tensor(np.asarray(row_labels, dtype=np.int64))
            labels[b, start] = -100  # never learn a row's first token from the previous row
            position_ids[b, start : start + n] = torch.arange(n)
            start += n
        position_ids[b, start:] = torch.arange(width - start)
    packed = {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids,
        "real_tokens": torch.tensor(real),
        "total_tokens": torch.tensor(input_ids.numel()),
    }
    if TEACHER_COLUMN in batch:  # logit_kl: the teacher's targets in the order kl_loss reads positions
        parts = [row_teacher_logprobs(stored, row_labels) for members in bins for _, row_labels, stored in members]
        packed[TEACHER_COLUMN] = (
            torch.from_numpy(np.concatenate(parts)) if parts else torch.zeros((0, 0), dtype=torch.float16)
        )
    return packed


def row_teacher_logprobs(stored: bytes, labels) -> np.ndarray:
    """A row's stored teacher targets (train.distill.teacher_targets) as [completion positions, number tokens]."""
    return np.frombuffer(stored, dtype=np.float16).reshape(len(completion_positions(labels)), -1)


def packed_examples(packed: dict) -> list[tuple[int, int, int]]:
    """(row, start, length) of each example in a pack_batch result, read back from where its
    position ids restart; the padding tail (no labels) is left out. For checks of packing."""
    import torch

    examples = []
    for b, positions in enumerate(packed["position_ids"]):
        for start in (positions == 0).nonzero().flatten().tolist():
            rest = positions[start:]
            n = int((rest == torch.arange(rest.numel(), device=rest.device)).cumprod(0).sum())
            if not packed["labels"][b, start : start + n].eq(-100).all():
                examples.append((b, start, n))
    return examples
