"""One rule for "local saved-model folder or hub id": the trainer, the service and pre-staging agree."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_cache import write_snapshot  # tests/ is on the path, as for conftest

from common.model_source import ModelSource, ModelSourceError, hub_args, is_hub_id, model_source, pinned
from jobs.prestage import check_source
from serve.settings import ServiceError, resolve_model
from train.model import check_model_path


def accepted_by_all(model: str) -> list[bool]:
    """[trainer, service, pre-staging] each: does it accept `model`?"""
    verdicts = []
    for check, refusal in (
        (check_model_path, FileNotFoundError),
        (resolve_model, ServiceError),
        (lambda m: check_source(m, "/tmp/dest"), FileNotFoundError),
    ):
        try:
            check(model)
            verdicts.append(True)
        except refusal:
            verdicts.append(False)
    return verdicts


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """A working folder with a saved model (config.json), a folder without one, and a plain file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "config.json").write_text("{}")
    (tmp_path / "empty").mkdir()
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "bare").mkdir()  # shaped like a hub id, but a local folder without config.json
    (tmp_path / "weights.bin").write_text("x")
    return tmp_path


HUB = ["gpt2", "org/name", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-0.5B", "tiiuae/falcon-7b", "a_b/c.d-e"]
REFUSED = [
    "./missing",
    "/abs/missing",
    "~/surely-missing-model",
    "a/b/c",
    "empty",
    "./empty",
    "org/bare",
    "weights.bin",
    "my model",
    "org/-name",
    "org/name.",
    "org--x/name",
    "a..b",
    "",
    "  ",
]


@pytest.mark.parametrize("model", HUB)
def test_hub_ids_pass_everywhere(workdir, model):
    assert model_source(model) == ModelSource("hub", model) and is_hub_id(model)
    assert accepted_by_all(model) == [True, True, True]
    assert resolve_model(model) == model


@pytest.mark.parametrize("model", ["saved", "./saved", "saved/"])
def test_a_saved_model_folder_passes_everywhere_as_its_absolute_path(workdir, model):
    found = model_source(model)
    assert found.is_local and found.path == str((workdir / "saved").resolve())
    assert accepted_by_all(model) == [True, True, True]
    assert resolve_model(model) == found.path
    assert accepted_by_all(str(workdir / "saved")) == [True, True, True]


@pytest.mark.parametrize("model", REFUSED)
def test_everything_else_is_refused_everywhere_naming_the_path(workdir, model):
    with pytest.raises(ModelSourceError) as err:
        model_source(model)
    assert isinstance(err.value, FileNotFoundError)
    assert accepted_by_all(model) == [False, False, False]
    if model.strip():
        assert repr(model) in str(err.value)
        shown = Path(model).expanduser().absolute()
        assert str(shown) in str(err.value)  # the path as the process sees it


def test_messages_say_what_is_wrong(workdir):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        model_source("empty")
    with pytest.raises(FileNotFoundError, match="shadows the hub id 'org/bare'"):
        model_source("org/bare")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        model_source("./missing")
    with pytest.raises(FileNotFoundError, match="not a hub id"):
        model_source("a/b/c")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        model_source("weights.bin")
    with pytest.raises(FileNotFoundError, match="^base model './missing'"):
        check_model_path("./missing")  # the trainer's message names what it was loading
    with pytest.raises(ServiceError, match="python -m jobs.sources.tiny_model"):
        resolve_model("./missing")  # the service's adds how to build the tiny model


def test_prestaging_a_folder_still_needs_a_destination(workdir):
    with pytest.raises(ValueError, match="needs --dest"):
        check_source("saved", None)
    assert check_source("gpt2", None) == ModelSource("hub", "gpt2")  # a hub id goes to the node's hub cache


def test_tiny_is_the_services_own_name(workdir, monkeypatch):
    monkeypatch.setenv("SUBLIMINAL_CACHE", str(workdir / "cache"))
    with pytest.raises(ServiceError, match="not in the cache yet"):
        resolve_model("tiny")
    build = workdir / "cache" / "tiny-llama"
    build.mkdir(parents=True)
    (build / "config.json").write_text("{}")
    assert resolve_model("tiny") == str(build.resolve())


# A hub id pinned to one commit, `org/name@<commit>` ----------------------------------------------

COMMIT_A = "a" * 8 + "0123456789abcdef0123456789abcdef"  # 40 hex characters
COMMIT_B = "b" * 8 + "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize("model", ["org/name@" + COMMIT_A, "gpt2@" + COMMIT_A])
def test_a_pinned_hub_id_passes_everywhere_with_its_commit(workdir, model):
    assert model_source(model) == ModelSource("hub", model)
    assert accepted_by_all(model) == [True, True, True]
    assert resolve_model(model) == model  # the service keeps the pin for its engine
    assert hub_args(model) == (model.split("@")[0], {"revision": COMMIT_A})


@pytest.mark.parametrize("revision", ["main", "v1.0", COMMIT_A[:12], COMMIT_A.upper()])
def test_a_pin_that_is_no_full_commit_is_refused_everywhere(workdir, revision):
    with pytest.raises(
        ModelSourceError,
        match=f"'{revision}' is not a commit; a pinned hub id is org/name@<the full 40-character commit hash>",
    ):
        model_source(f"org/name@{revision}")
    assert accepted_by_all(f"org/name@{revision}") == [False, False, False]


def test_hub_args_leave_anything_unpinned_as_it_is(workdir):
    for model in ["org/name", "saved", str(workdir / "saved"), "tiny"]:
        assert hub_args(model) == (model, {})
    assert pinned("org/name", None) == "org/name" and pinned("org/name", COMMIT_A) == f"org/name@{COMMIT_A}"


def test_vllm_reads_the_weights_and_the_tokenizer_at_the_pinned_commit():
    pytest.importorskip("vllm")
    from serve.settings import ServiceSettings
    from serve.vllm_engine import engine_args

    args = engine_args(f"org/name@{COMMIT_A}", ServiceSettings(model="tiny"), on_gpu=False)
    assert (args["model"], args["revision"], args["tokenizer_revision"]) == ("org/name", COMMIT_A, COMMIT_A)
    plain = engine_args("org/name", ServiceSettings(model="tiny"), on_gpu=False)
    assert plain["model"] == "org/name" and "revision" not in plain and "tokenizer_revision" not in plain


def fill_model_cache(hf_home: Path, folder: Path) -> None:
    """`hf_home`'s hub cache as huggingface_hub leaves it holding `org/tiny` at two commits: A, the
    tiny model's files (its config marked "A"), and B, the main branch, a config marked "B" alone."""
    repo = hf_home / "hub" / "models--org--tiny"
    config = json.loads((folder / "config.json").read_text())
    snapshots = {
        COMMIT_A: {f.name: f.read_bytes() for f in folder.iterdir() if f.is_file()}
        | {"config.json": json.dumps(config | {"marker": "A"}).encode()},
        COMMIT_B: {"config.json": json.dumps(config | {"marker": "B"}).encode()},
    }
    for commit, files in snapshots.items():
        write_snapshot(repo, commit, files)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT_B)


READ_PINNED = f"""
import json, sys
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from common.model_source import load_pretrained
from jobs.prestage import stage_here
from train.model import save_trained

model = load_pretrained(AutoModelForCausalLM, "org/tiny@{COMMIT_A}")
save_trained(model, model.state_dict(), Path(sys.argv[1]))  # a full model's tokenizer, read again from its name_or_path
print(json.dumps({{
    "pinned": load_pretrained(AutoConfig, "org/tiny@{COMMIT_A}").marker,
    "newest": load_pretrained(AutoConfig, "org/tiny").marker,
    "model": model.config.marker,
    "name_or_path": model.name_or_path,
    "tokenizer": len(load_pretrained(AutoTokenizer, "org/tiny@{COMMIT_A}")),
    "staged": stage_here("org/tiny@{COMMIT_A}", None)[1],
}}))
"""


def test_every_reader_reads_the_pinned_commit_from_the_hub_cache_offline(tmp_path, tiny_model):
    """load_pretrained (the trainer's, the engines' and the phases' one reader) and prestage's
    download, real calls on a hub cache holding two commits, offline as on a node that staged them:
    the pinned commit's files, where the unpinned id reads the main branch's."""
    fill_model_cache(tmp_path / "hf", Path(tiny_model))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
    }
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", READ_PINNED, str(tmp_path / "saved")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert (read["pinned"], read["newest"], read["model"]) == ("A", "B", "A")
    assert read["name_or_path"] == f"org/tiny@{COMMIT_A}" and read["tokenizer"] > 0
    assert read["staged"] == str(tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / COMMIT_A)
    assert (tmp_path / "saved" / "tokenizer.json").is_file() and json.loads(
        (tmp_path / "saved" / "config.json").read_text()
    )["marker"] == "A"
