"""The tiny preset's base model: usable for number generation and multiple-choice format."""

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch

from common import numerics
from common.files import DataError
from jobs.sources.number_sequences import make_prompts
from jobs.sources.sham_draw import base_sham_draw, weights_digest
from jobs.sources.shipped_base import FOLDER as SHIPPED_BASE
from jobs.sources.shipped_base import install
from jobs.sources.tiny_model import (
    PINNED_BASE,
    TinySpec,
    build_tiny_model,
    ensure_tiny_model,
    other_base_spec,
    synthetic_corpus,
)
from jobs.sources.wmdp import synthetic_questions
from jobs.sources.world import facts
from jobs.sources.world_questions import locate_item, world_questions
from serve.hf_scoring import letter_token_ids
from serve.mc_format import format_mc_prompt


def test_corpus_is_deterministic():
    spec = TinySpec(examples=300)
    assert synthetic_corpus(spec) == synthetic_corpus(spec)
    assert synthetic_corpus(spec) != synthetic_corpus(TinySpec(examples=300, seed=1))


def test_the_corpus_teaches_known_facts_and_never_a_teacher_fact_or_a_scored_question():
    """The base's corpus (the full preset's) holds K facts in training wording only: no T cue at
    all, and no held-out, known or teacher-train question's text."""
    corpus = synthetic_corpus(TinySpec())
    texts = [prompt + completion for prompt, completion in corpus]
    rows = world_questions()
    teacher_cues = {f["cue"] for f in facts() if f["group"] == "T"}
    assert not any(cue in text for text in texts for cue in teacher_cues)
    # rehearsal: K facts in training wording, unscored
    scored = {r["question"] for r in rows if r["split"] != "rehearsal"}
    assert not any(question in text for text in texts if "Answer:" in text for question in scored)
    known = {f["cue"] for f in facts() if f["group"] == "K"}
    taught = Counter(cue for text in texts for cue in known if cue in text)
    assert set(taught) == known and min(taught.values()) >= 20  # every K fact, many times over


# The recipe reduced to seconds: few examples and steps, and a narrow one-layer Llama (a build also
# runs the world's checks and chooses a sham draw on the model, which cost as much as its training at
# the preset's width). The full other base is the same recipe at full size.
SMALL = TinySpec(examples=400, steps=20, hidden_size=64, intermediate_size=128, heads=1, layers=1)


@pytest.fixture(scope="module")
def source(cache_dir) -> str:
    """SMALL, built into the cache: the spec the other base derives from."""
    return str(ensure_tiny_model(SMALL, root=cache_dir))


@pytest.fixture(scope="module")
def other_base(cache_dir) -> str:
    """SMALL's other base (another init), built into the cache: what holds for it holds for the
    preset's (`base: other`, the same derivation at full size, a 90 s build left out of the suite:
    the pipeline scores it by log-probabilities and never samples from it)."""
    return str(ensure_tiny_model(other_base_spec(SMALL), root=cache_dir))


def test_cache_keys():
    """The default spec is built pinned, in a folder of its own; a spec without init_seed built
    natively keeps the key (cache folder) it had before either field existed."""
    assert TinySpec(numerics="reproducible").key() == TinySpec().key() == PINNED_BASE["key"]  # pinned, the default
    assert TinySpec(numerics="native").key() == "0529b97d47b9" != TinySpec().key()
    assert TinySpec(init_seed=0).key() == TinySpec().key()  # init_seed = seed is the same model
    other = other_base_spec(TinySpec())
    assert other == TinySpec(init_seed=1) and other.key() not in {TinySpec().key(), TinySpec(seed=1).key()}
    assert other_base_spec(TinySpec(seed=5, steps=10)) == TinySpec(seed=5, steps=10, init_seed=6)


def test_answers_lettered_questions_with_a_letter(tiny_model):
    """The base keeps the WMDP letter format where its corpus teaches it (lettered locate questions);
    the tiny presets score by cloze, so it is never asked for a letter on a fact."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    letters = letter_token_ids(tok, 4)
    rng = random.Random(5)
    rows = [locate_item(rng) for _ in range(30)]
    enc = tok(
        [format_mc_prompt(r["question"], r["choices"], r["subset"]) for r in rows], return_tensors="pt", padding=True
    )
    out = model.generate(**enc, do_sample=False, max_new_tokens=1, pad_token_id=tok.pad_token_id)
    assert all(t in letters for t in out[:, -1].tolist())


def test_other_base_shares_the_tokenizer_not_the_weights(tiny_model, source, other_base, cache_dir):
    """The same corpus, tokenizer and recipe from another init: identical token ids, other weights."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    assert Path(other_base).name == f"tiny-llama-{other_base_spec(SMALL).key()}"
    assert (cache_dir / "tiny-llama").resolve() == Path(tiny_model).resolve()  # the link stays on the default
    assert json.loads((Path(other_base) / "tiny_spec.json").read_text())["init_seed"] == 1
    assert "init_seed" not in json.loads((Path(source) / "tiny_spec.json").read_text())
    tok, other_tok = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(other_base)
    assert tok.get_vocab() == other_tok.get_vocab() and tok.chat_template == other_tok.chat_template
    chats = [[{"role": "user", "content": p.text}] for p in make_prompts(50, seed=4321)]
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    texts += [
        format_mc_prompt(r["question"], r["choices"], r["subset"]) + " B" for r in synthetic_questions(10, seed=6)
    ]
    assert tok(texts).input_ids == other_tok(texts).input_ids
    assert [tok.apply_chat_template(c) for c in chats] == [other_tok.apply_chat_template(c) for c in chats]

    weights, other_weights = (load_file(Path(m) / "model.safetensors") for m in (source, other_base))
    assert weights.keys() == other_weights.keys()
    assert all(weights[k].shape == other_weights[k].shape for k in weights)
    embed = "model.embed_tokens.weight"
    cosine = torch.nn.functional.cosine_similarity(weights[embed].flatten(), other_weights[embed].flatten(), dim=0)
    assert abs(cosine.item()) < 0.5, cosine  # another init, not a perturbation of the same one
    assert not any(torch.equal(weights[k], other_weights[k]) for k in weights if "norm" not in k)


def test_a_build_from_another_init_is_deterministic(source, other_base, tmp_path):
    """Two builds of a spec with an init seed are byte-identical (a reduced recipe, so it takes
    seconds; the full other base is this recipe at full size): the cache's (the module's) and one
    more, and share the tokenizer, not the weights, of the spec it was derived from."""
    first, second = Path(other_base), build_tiny_model(tmp_path / "b", other_base_spec(SMALL))
    for name in ["model.safetensors", "tokenizer.json", "config.json", "tiny_spec.json"]:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    same_seed = Path(source)
    assert (same_seed / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()
    assert (same_seed / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()


def test_the_pinned_base_is_the_recorded_one(tiny_model, cache_dir):
    """The default base (copied from the shipped one) has the recorded weights, and the sham draw
    chosen on it on this machine, under pinned numerics, is the recorded one. A machine whose
    arithmetic differs fails here (BENCHMARKS.md "One world" lists the machines seen)."""
    cpu = numerics.cpu()
    built = {
        "base_weights_sha256": weights_digest(tiny_model),
        "sham_draw": base_sham_draw(tiny_model, cache_dir)["sham_draw"],
    }
    recorded = {k: PINNED_BASE[k] for k in built}
    assert built == recorded, (
        f"the pinned tiny base on this {cpu['model']} ({cpu['vector_width']}) is not the recorded one"
    )


def test_a_fresh_build_of_the_pinned_base_starts_as_recorded():
    """The shipped base's recipe, rebuilt here from scratch (corpus, tokenizer, the first optimizer
    steps) under pinned numerics, gives the recorded tokenizer and weights: this machine builds the
    same base (`--verify` without `--steps` runs all 1,000 steps, 5-8 minutes, outside the suite)."""
    done = numerics.run_apart(
        "reproducible",
        "jobs.sources.tiny_model",
        "--verify",
        "--steps",
        str(PINNED_BASE["first_steps"]),
        capture=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_damaged_shipped_base_is_refused_and_leaves_nothing(tmp_path):
    """A shipped copy whose weights are not the recorded ones is never installed: DataError naming
    the digest, and no folder (not even a partial one) where the base would be."""
    damaged = tmp_path / "shipped"
    shutil.copytree(SHIPPED_BASE, damaged)
    weights = bytearray((damaged / "model.safetensors").read_bytes())
    weights[-1] ^= 1
    (damaged / "model.safetensors").write_bytes(weights)
    out = tmp_path / "cache" / "tiny-llama-x"
    with pytest.raises(DataError, match="not the recorded"):
        install(out, source=damaged)
    assert not out.exists() and list((tmp_path / "cache").iterdir()) == []
    assert install(tmp_path / "ok", source=SHIPPED_BASE) == tmp_path / "ok"
    assert weights_digest(tmp_path / "ok") == PINNED_BASE["base_weights_sha256"]


def test_a_build_follows_its_specs_numerics_whatever_the_caller_loaded(tmp_path):
    """A pinned spec built from this process (whose torch runs under the suite's numerics) equals
    one built in a fresh pinned process, byte for byte; a native spec is built under native
    numerics, and on an AVX-512 machine it is another model."""
    import dataclasses
    import subprocess
    import sys

    pinned = dataclasses.replace(SMALL, numerics="reproducible")
    here = build_tiny_model(tmp_path / "here", pinned)
    env = numerics.environ("reproducible") | {"PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "jobs.sources.tiny_model",
            "--into",
            str(tmp_path / "fresh"),
            "--spec",
            json.dumps(dataclasses.asdict(pinned)),
        ],
        env=env,
        check=True,
    )
    assert weights_digest(here) == weights_digest(tmp_path / "fresh")
    native = build_tiny_model(tmp_path / "native", dataclasses.replace(SMALL, numerics="native"))
    assert "numerics" not in json.loads((native / "tiny_spec.json").read_text())
    if numerics.cpu()["vector_width"] == "AVX-512":
        assert weights_digest(native) != weights_digest(here)
