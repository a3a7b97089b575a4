"""One rule for "local saved-model folder or hub id": the trainer, the service and pre-staging agree."""

from pathlib import Path

import pytest

from common.model_source import ModelSource, ModelSourceError, is_hub_id, model_source
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
REFUSED = ["./missing", "/abs/missing", "~/surely-missing-model", "a/b/c", "empty", "./empty", "org/bare", "weights.bin",
           "my model", "org/-name", "org/name.", "org--x/name", "a..b", "", "  "]  # fmt: skip


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
    with pytest.raises(ServiceError, match="not built yet"):
        resolve_model("tiny")
    build = workdir / "cache" / "tiny-llama"
    build.mkdir(parents=True)
    (build / "config.json").write_text("{}")
    assert resolve_model("tiny") == str(build.resolve())
