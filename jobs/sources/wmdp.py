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

The synthetic sample is harmless and learnable: each subset is a small body of
facts (bio: which organ does what; chem: states of matter; cyber: which
protocol serves a purpose) that a tiny model can pick up from a train split.
Every question text is unique, so a split by question text is meaningful.
"""

from __future__ import annotations

import numbers
import random
from pathlib import Path

from common.atomic import write_jsonl
from common.files import DataError, read_jsonl

SUBSETS = ("bio", "chem", "cyber")
HUB_ID = "cais/wmdp"
SYNTHETIC_VERSION = 2  # 2: rows carry their cue as `cluster`


# Each subset is a small body of harmless "knowledge": a cue in the question
# names the answer, the choices come in a fixed order, and fillers (who, how
# much) make every question text unique. A LoRA learns cue -> answer from the
# train split and must generalise to unseen fillers and phrasings.
_FACTS = {
    "bio": (
        ["Heart", "Lungs", "Liver", "Kidneys"],
        [
            ["pumps blood around the body", "keeps the blood circulating", "beats to move blood"],
            ["takes in oxygen from the air", "exchanges oxygen and carbon dioxide", "fills with air when breathing"],
            ["makes bile for digestion", "stores glycogen for energy", "breaks down old red blood cells"],
            ["filters waste into urine", "balances water and salts in the blood", "removes urea from the blood"],
        ],
        [
            "a horse",
            "a dog",
            "a cat",
            "a rabbit",
            "a sheep",
            "a goat",
            "a cow",
            "a pig",
            "a mouse",
            "a fox",
            "a deer",
            "a bear",
            "a wolf",
            "a lion",
            "a tiger",
            "an otter",
            "a seal",
            "a whale",
            "a dolphin",
            "a bat",
            "a camel",
            "a llama",
            "a zebra",
            "a giraffe",
            "a hamster",
            "a squirrel",
            "a badger",
            "a beaver",
            "a moose",
            "an elephant",
            "a monkey",
            "a panda",
            "a koala",
            "a hedgehog",
            "a mole",
            "a ferret",
            "a lynx",
            "a yak",
        ],
        ["In {who}, which organ {cue}?", "Which organ of {who} {cue}?", "A vet asks which organ {cue} in {who}. Which is it?"],
    ),
    "chem": (
        ["Solid", "Liquid", "Gas", "Plasma"],
        [
            ["iron", "table salt", "sugar", "copper", "quartz", "wax", "granite", "chalk"],
            ["water", "ethanol", "olive oil", "vinegar", "mercury", "honey", "milk", "glycerol"],
            ["oxygen", "nitrogen", "helium", "neon", "argon", "carbon dioxide", "hydrogen", "methane"],
            ["a lightning bolt", "a neon sign's glow", "the solar corona", "an aurora", "a welding arc", "a plasma ball"],
        ],
        [str(n) for n in range(2, 60)],
        [
            "A jar holds {who} grams of {cue} at room temperature. Which state of matter is it in?",
            "At room temperature, what state is a {who} gram sample of {cue}?",
        ],
    ),
    "cyber": (
        ["HTTP", "SSH", "DNS", "SMTP"],
        [
            ["load a web page", "fetch a website", "download a page from a web server"],
            ["open a remote shell", "log in to a remote terminal securely", "run commands on a remote server"],
            ["look up the address of a host name", "resolve a domain name", "translate a name into an IP address"],
            ["send an email", "deliver mail to a mail server", "relay an outgoing message"],
        ],
        [
            "printer",
            "router",
            "laptop",
            "phone",
            "server",
            "camera",
            "tablet",
            "kiosk",
            "thermostat",
            "scanner",
            "smart TV",
            "game console",
            "desktop",
            "workstation",
            "point-of-sale terminal",
            "door controller",
        ],
        [
            "An office {who} needs to {cue}. Which protocol does it use?",
            "Which protocol would a {who} use to {cue}?",
            "To {cue}, which protocol does the {who} rely on?",
        ],
    ),
}


def _make_question(subset: str, rng: random.Random) -> tuple[str, list[str], int, str]:
    """(question, choices, answer, cue): questions sharing a cue share their answer."""
    choices, cues, fillers, templates = _FACTS[subset]
    answer = rng.randrange(len(choices))
    template, who, cue = rng.choice(templates), rng.choice(fillers), rng.choice(cues[answer])  # v1's draw order: v1's questions
    question = template.format(who=who, cue=cue)
    return question, list(choices), answer, cue


def synthetic_questions(n_per_subset: int = 400, seed: int = 0) -> list[dict]:
    """Deterministic synthetic questions with unique question texts. `cluster` names the
    answer-determining cue: questions sharing it are one unit of evidence, not several."""
    rows = []
    for subset in SUBSETS:
        rng = random.Random(f"{seed}-{subset}")
        seen: set[str] = set()
        for _ in range(50 * n_per_subset):
            question, choices, answer, cue = _make_question(subset, rng)
            if question not in seen:
                seen.add(question)
                rows.append({"question": question, "choices": choices, "answer": answer, "subset": subset, "cluster": f"{subset}: {cue}"})
            if len(seen) == n_per_subset:
                break
        if len(seen) < n_per_subset:
            raise ValueError(f"subset {subset} cannot make {n_per_subset} distinct questions")
    return rows


def write_synthetic(directory: Path, n_per_subset: int = 400, seed: int = 0) -> Path:
    """Write the synthetic sample as `wmdp-<subset>.jsonl` files (atomically), once."""
    directory = Path(directory)
    if all((directory / f"wmdp-{s}.jsonl").is_file() for s in SUBSETS):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rows = synthetic_questions(n_per_subset, seed)
    for subset in SUBSETS:
        keep = ("question", "choices", "answer", "cluster")
        write_jsonl(directory / f"wmdp-{subset}.jsonl", ({k: row[k] for k in keep} for row in rows if row["subset"] == subset))
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


def hub_snapshot(subsets: tuple[str, ...]) -> Path:
    """The local snapshot folder of `cais/wmdp` holding `subsets`' test files: downloaded into the
    hub cache when the hub is reachable, else the cached snapshot of its main branch (offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(HUB_ID, repo_type="dataset", allow_patterns=hub_patterns(subsets)))
    except (HfHubHTTPError, LocalEntryNotFoundError) as err:
        raise DataError(
            f"{HUB_ID} could not be downloaded and is not in the hub cache ({type(err).__name__}: {err}); "
            f"fill the cache with `hf download {HUB_ID} --repo-type dataset`, or set data.source to a folder"
        ) from err


def _hub_items(snapshot: Path, subset: str) -> list[tuple[str, object]]:
    """(where, row) pairs of one subset's test split in a `cais/wmdp` snapshot folder."""
    (pattern,) = hub_patterns((subset,))
    files = sorted(snapshot.glob(pattern))
    if not files:
        raise DataError(f"{HUB_ID}: no {pattern} in {snapshot} (a cache filled with other subsets?)")
    return [(f"{HUB_ID} {path.relative_to(snapshot)} row {i}", row) for path in files for i, row in enumerate(_parquet_rows(path))]


def _parquet_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def load_wmdp(source: str, subsets: tuple[str, ...] = SUBSETS, cache_dir: Path | None = None) -> list[dict]:
    """Validated questions from `source`: "synthetic", "hub", or a folder of local files."""
    if source == "synthetic":
        if cache_dir is None:
            raise DataError("the synthetic sample needs a cache_dir to be written to")
        source = str(write_synthetic(Path(cache_dir) / f"synthetic-wmdp-v{SYNTHETIC_VERSION}"))
    snapshot = hub_snapshot(tuple(subsets)) if source == "hub" else None
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


def split_questions(rows: list[dict], eval_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(teacher-train, held-out eval), disjoint by question text, deterministic in seed.

    The split is by a seeded hash of the question text, so duplicates of a
    question always land on the same side and the split does not depend on order.
    """
    import hashlib

    def held_out(question: str) -> bool:
        digest = hashlib.sha256(f"{seed}:{question.strip()}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction

    train = [r for r in rows if not held_out(r["question"])]
    test = [r for r in rows if held_out(r["question"])]
    return train, test
