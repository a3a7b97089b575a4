"""WMDP questions: the real `cais/wmdp` (hub or local files) and a synthetic stand-in.

All sources end in the same reader: `load_wmdp(source)` turns the hub dataset, a
folder of local parquet/JSONL files, or the shipped synthetic sample (written to
JSONL first) into validated rows `{question, choices, answer, subset}`.

The hub dataset `cais/wmdp` has one config per subset, `wmdp-<subset>`, each a
`test` split in one parquet file (`wmdp-bio/test-00000-of-00001.parquet`, with
columns `question`, `choices`, `answer`). Those files are fetched with
huggingface_hub into its cache (`$HF_HOME/hub`) and read from there, so a node
with `HF_HUB_OFFLINE=1` and a cache filled beforehand (`hf download cais/wmdp
--repo-type dataset`) reads them without the network.

The synthetic sample is the tiny world (jobs/sources/world.py): harmless facts
about fictional creatures, substances and services, each row naming its own
split. Every question text is unique.
"""

from __future__ import annotations

import numbers
from pathlib import Path

from common.atomic import write_jsonl
from common.files import DataError, read_jsonl
from jobs.sources.world import SHAM_DRAW, WORLD_VERSION
from jobs.sources.world_questions import world_questions

SUBSETS = ("bio", "chem", "cyber")
HUB_ID = "cais/wmdp"
SPLITS = ("train", "held_out", "known", "rehearsal")  # a row's own `split`, where it names one


def synthetic_questions(n_per_subset: int | None = None, seed: int = 0) -> list[dict]:
    """The shipped synthetic sample: the tiny world's questions (jobs/sources/world_questions.py), each with
    its `cluster` (the cue: questions sharing it are one unit of evidence), `group` and `split`.
    With `n_per_subset` (tests and benchmarks that need a count of well-formed questions), the
    first n of each subset, from the worlds of seed, seed + 1, ... as one is not enough."""
    if n_per_subset is None:
        return world_questions(seed)
    rows, world = [], seed
    while any(sum(r["subset"] == s for r in rows) < n_per_subset for s in SUBSETS):
        rows += world_questions(world)
        world += 1
    return [r for s in SUBSETS for r in [r for r in rows if r["subset"] == s][:n_per_subset]]


def write_synthetic(directory: Path, seed: int = 0, draw: int = SHAM_DRAW, pair: int = 0) -> Path:
    """Write the synthetic sample (teacher–sham pair `pair`'s facts, draw `draw` of its sham's) as
    `wmdp-<subset>.jsonl` files (atomically), once."""
    directory = Path(directory)
    if all((directory / f"wmdp-{s}.jsonl").is_file() for s in SUBSETS):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rows = world_questions(seed, draw, pair)
    for subset in SUBSETS:
        keep = ("question", "choices", "answer", "cluster", "group", "split", "sham")
        write_jsonl(
            directory / f"wmdp-{subset}.jsonl",
            ({k: row[k] for k in keep if k in row} for row in rows if row["subset"] == subset),
        )
    return directory


def validate_row(row: object, where: str, subset: str) -> dict:
    """One normalised question, or DataError naming `where` and the problem."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected an object, got {type(row).__name__}")
    for key in ("question", "choices", "answer"):
        if key not in row:
            raise DataError(f"{where}: missing field {key!r}")
    question, choices, answer = row["question"], row["choices"], row["answer"]
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: 'question' must be a non-empty string")
    if hasattr(choices, "tolist"):  # parquet gives numpy arrays
        choices = choices.tolist()
    if not isinstance(choices, list) or not 2 <= len(choices) <= 26 or not all(isinstance(c, str) for c in choices):
        raise DataError(f"{where}: 'choices' must be a list of 2..26 strings")
    if isinstance(answer, bool) or not isinstance(answer, numbers.Integral):
        raise DataError(f"{where}: 'answer' must be an integer index, got {answer!r}")
    answer = int(answer)
    if not 0 <= answer < len(choices):
        raise DataError(f"{where}: 'answer' {answer} is out of range for {len(choices)} choices")
    row_out = {"question": question, "choices": choices, "answer": answer, "subset": subset}
    cluster = row.get("cluster")
    if cluster is not None:
        if not isinstance(cluster, str) or not cluster:
            raise DataError(f"{where}: 'cluster' must be a non-empty string (questions that are one unit of evidence)")
        row_out["cluster"] = cluster
    sham = row.get("sham")
    if sham is not None:  # the tiny world's T questions: the index of the sham teacher's fact
        if (
            isinstance(sham, bool)
            or not isinstance(sham, numbers.Integral)
            or not 0 <= sham < len(choices)
            or sham == answer
        ):
            raise DataError(f"{where}: 'sham' must be the index of a choice other than the answer, got {sham!r}")
        row_out["sham"] = int(sham)
    for key, allowed in (("group", None), ("split", SPLITS)):
        value = row.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value or (allowed and value not in allowed):
            raise DataError(
                f"{where}: {key!r} must be "
                + (f"one of {', '.join(allowed)}" if allowed else "a non-empty string")
                + f", got {value!r}"
            )
        row_out[key] = value
    return row_out


def _read_file(path: Path) -> list[tuple[str, object]]:
    """(where, row) pairs of a parquet or JSONL file; `where` names the file and row for errors."""
    if path.suffix == ".parquet":
        return [(f"{path} row {i}", r) for i, r in enumerate(_parquet_rows(path))]
    return [(f"{path} line {n}", r) for n, r in read_jsonl(path, DataError)]


def _local_files(directory: Path, subset: str) -> list[Path]:
    names = [f"wmdp-{subset}", subset]
    found = [directory / f"{n}{ext}" for n in names for ext in (".jsonl", ".parquet")]
    found = [p for p in found if p.is_file()]
    # The hub's own parquet layout: wmdp-bio/test-00000-of-00001.parquet
    found += sorted((directory / f"wmdp-{subset}").glob("*.parquet"))
    return found


def hub_patterns(subsets: tuple[str, ...]) -> list[str]:
    """The files of `cais/wmdp` holding the `test` split of each subset's config (`wmdp-<subset>`)."""
    return [f"wmdp-{subset}/test-*.parquet" for subset in subsets]


def hub_snapshot(subsets: tuple[str, ...], revision: str | None = None) -> Path:
    """The local snapshot folder of `cais/wmdp` holding `subsets`' test files, at commit `revision`
    (`data.revision`; None: the main branch's newest): downloaded into the hub cache when the hub is
    reachable, else the cached snapshot of that commit, or of the main branch (offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(HUB_ID, repo_type="dataset", revision=revision, allow_patterns=hub_patterns(subsets))
        )
    except (HfHubHTTPError, LocalEntryNotFoundError) as err:
        at = f" at {revision}" if revision else ""
        pin = f" --revision {revision}" if revision else ""
        raise DataError(
            f"{HUB_ID}{at} could not be downloaded and is not in the hub cache ({type(err).__name__}: {err}); "
            f"fill the cache with `hf download {HUB_ID} --repo-type dataset{pin}`, or set data.source to a folder"
        ) from err


def _hub_items(snapshot: Path, subset: str) -> list[tuple[str, object]]:
    """(where, row) pairs of one subset's test split in a `cais/wmdp` snapshot folder."""
    (pattern,) = hub_patterns((subset,))
    files = sorted(snapshot.glob(pattern))
    if not files:
        raise DataError(f"{HUB_ID}: no {pattern} in {snapshot} (a cache filled with other subsets?)")
    return [
        (f"{HUB_ID} {path.relative_to(snapshot)} row {i}", row)
        for path in files
        for i, row in enumerate(_parquet_rows(path))
    ]


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def load_wmdp(
    source: str,
    subsets: tuple[str, ...] = SUBSETS,
    cache_dir: Path | None = None,
    sham_draw: int = SHAM_DRAW,
    pair: int = 0,
    revision: str | None = None,
) -> list[dict]:
    """Validated questions from `source`: "synthetic", "hub", or a folder of local files. The
    synthetic sample is the tiny world of teacher–sham pair `pair` (jobs/sources/world.py) with draw
    `sham_draw` of its sham's facts (a run passes the draw chosen on its base: jobs/sources/sham_draw.py).
    `revision`: the hub source's commit (`data.revision`)."""
    if source == "synthetic":
        if cache_dir is None:
            raise DataError("the synthetic sample needs a cache_dir to be written to")
        # files written once per world
        name = f"synthetic-wmdp-v{WORLD_VERSION}-sham{sham_draw}" + (f"-pair{pair}" if pair else "")
        source = str(write_synthetic(Path(cache_dir) / name, draw=sham_draw, pair=pair))
    snapshot = hub_snapshot(tuple(subsets), revision) if source == "hub" else None
    rows: list[dict] = []
    for subset in subsets:
        if snapshot is not None:
            items = _hub_items(snapshot, subset)
        else:
            directory = Path(source)
            if not directory.is_dir():
                raise DataError(f"WMDP source {source!r} is neither 'synthetic', 'hub' nor a folder")
            files = _local_files(directory, subset)
            if not files:
                raise DataError(f"no wmdp-{subset}.jsonl or .parquet file in {directory}")
            items = [item for p in files for item in _read_file(p)]
        if not items:
            raise DataError(f"subset {subset!r} of {source} holds no questions")
        rows += [validate_row(r, where, subset) for where, r in items]
    return rows


def split_questions(rows: list[dict], eval_fraction: float, seed: int) -> dict[str, list[dict]]:
    """{split: rows} for train (the teacher's), held_out, known and rehearsal, deterministic in seed.

    A row that names its `split` goes there (the synthetic world's rows do: held-out
    means other wording of the teacher's facts, known the base's own facts, rehearsal
    the base's facts trained into the teacher unscored). Other
    rows are split by a seeded hash of the question text into train and held_out,
    so duplicates of a question always land on the same side and the split does
    not depend on order.
    """
    import hashlib

    def side(row: dict) -> str:
        if "split" in row:
            return row["split"]
        digest = hashlib.sha256(f"{seed}:{row['question'].strip()}".encode()).digest()
        return "held_out" if int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction else "train"

    out: dict[str, list[dict]] = {split: [] for split in SPLITS}
    for row in rows:
        out[side(row)].append(row)
    return out
