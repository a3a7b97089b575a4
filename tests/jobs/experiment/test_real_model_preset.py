"""configs/qwen2.5-1.5b.yaml, the real-model preset for one GPU, checked on CPU without the network.

Its model is Qwen2 (Qwen/Qwen2.5-1.5B-Instruct). A tiny Qwen2 is built here in the same format: a
Qwen2ForCausalLM from a local config (2 layers, tied embeddings, q/k/v biases) saved with
save_pretrained, and a Qwen2Tokenizer (byte-level BPE over Qwen's pre-tokenizer, no BOS,
`<|im_end|>` ending a turn, `<|endoftext|>` padding, a ChatML chat template) trained on a few
hundred texts. Then: the preset plans (`--plan`) against it and a local folder of WMDP-shaped
files with the hub offline; the trainer's loader puts LoRA on every target module the preset
names, the memory plan's counts match the real model (biases included), and the transformers
engine serves the adapter the trainer saves; the memory plan sizes the preset for a 24 GB GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.experiment.config import load_experiment
from jobs.sizing.shape import KNOWN_SHAPES, Shape

ROOT = Path(__file__).resolve().parents[3]
PRESET = "qwen2.5-1.5b"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
# Qwen2.5's chat template for plain messages (its default system turn included); its tools branch left out.
CHATML = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def qwen_tokenizer(texts: list[str]):
    """A Qwen2Tokenizer (Qwen's own class, pre-tokenizer and special tokens) with a BPE trained on `texts`."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated")
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=800,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    trained = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tokenizer = Qwen2Tokenizer(vocab=trained["vocab"], merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    return tokenizer


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory) -> Path:
    """A tiny Qwen2 saved as Qwen/Qwen2.5-1.5B-Instruct is (random weights: loading is under test, not answers)."""
    import random

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jobs.sources.wmdp import synthetic_questions
    from serve.mc_format import choice_continuation, cloze_continuation, format_cloze_prompt, format_mc_prompt

    rng = random.Random(0)
    rows = synthetic_questions(n_per_subset=30)
    texts = [
        format_mc_prompt(q["question"], q["choices"], q["subset"]) + choice_continuation(q["answer"]) for q in rows
    ]
    texts += [
        format_cloze_prompt(q["question"], q["subset"]) + cloze_continuation(q["choices"][q["answer"]]) for q in rows
    ]
    texts += [", ".join(str(rng.randint(0, 999)) for _ in range(10)) for _ in range(300)]
    tokenizer = qwen_tokenizer(texts)
    config = Qwen2Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    out = tmp_path_factory.mktemp("qwen") / "Qwen2.5-tiny"
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def wmdp_folder(tmp_path_factory) -> Path:
    """A local data.source: wmdp-<subset>.jsonl files shaped as cais/wmdp's rows (question, 4 choices, answer)."""
    folder = tmp_path_factory.mktemp("wmdp")
    for subset in ("bio", "chem", "cyber"):
        rows = [
            {
                "question": f"Which {subset} option is number {i % 4}?",
                "choices": [f"option {k}" for k in range(4)],
                "answer": i % 4,
            }
            for i in range(20)
        ]
        (folder / f"wmdp-{subset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_the_preset_is_qwen_on_wmdp_from_the_hub():
    cfg = load_experiment(PRESET)
    assert (cfg.model.path, cfg.data.source, cfg.evaluate.format) == (MODEL, "hub", "letters")  # lm-eval's WMDP prompt


def test_the_preset_plans_on_cpu_against_local_folders(tiny_qwen, wmdp_folder, tmp_path):
    """`--plan` with model.path and data.source set to local folders, the hub offline: every stage
    planned, none reading the hub (no [pins] warning), nothing run."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    args = [
        "--config",
        PRESET,
        "--set",
        f"model.path={tiny_qwen}",
        "--set",
        f"data.source={wmdp_folder}",
        "--run-dir",
        str(tmp_path / "run"),
        "--plan",
    ]
    done = subprocess.run(
        [sys.executable, "jobs/pipeline.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "preset: llama-8b.yaml <- qwen2.5-1.5b.yaml" in done.stdout and "[pins]" not in done.stdout
    cfg = load_experiment(PRESET)
    # numbers, arm model and its eval per arm and replicate; data, teacher, evals, report
    stages = cfg.replicates * (2 + 2 * len(cfg.arms)) + 5
    assert f"{stages} of {stages} stages to run" in done.stdout, done.stdout
    assert not (tmp_path / "run" / "data").exists()


def test_the_loaders_take_the_qwen_format_and_every_lora_target(tiny_qwen, tmp_path):
    """The trainer's loader wraps each target module of the preset in every layer (PEFT refuses a
    target it cannot find; the count says none is missed), the memory plan counts the real model's
    parameters, q/k/v biases included, and the transformers engine serves the adapter the trainer
    saves: WMDP's letters one token each, numbers generated through the chat template."""
    import asyncio

    import torch
    from transformers import AutoConfig, AutoTokenizer

    from serve.engine import Sampling
    from serve.hf_engine import HFEngine
    from serve.mc_format import format_mc_prompt
    from serve.settings import ServiceSettings
    from train.model import load_lora_model, save_trained, trainable_state

    train = load_experiment(PRESET, [f"model.path={tiny_qwen}"]).teacher.replace(use_gpu=False)
    # every projection of Qwen2
    assert sorted(train.lora_targets) == sorted(Shape.from_config(KNOWN_SHAPES[MODEL]).projections())
    model = load_lora_model(str(tiny_qwen), train, torch.device("cpu"))
    shape = Shape.from_config(AutoConfig.from_pretrained(tiny_qwen).to_dict())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == shape.lora_params(train.lora_rank, train.lora_targets)
    assert sum(p.numel() for p in model.parameters()) - trainable == shape.params() and shape.qkv_bias
    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen)
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Continue: 1, 2, 3"}], tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(chat, add_special_tokens=False, return_tensors="pt").input_ids
    model(input_ids=ids, labels=ids).loss.backward()
    with torch.no_grad():  # a trained adapter's B is not zero: the engine must then score otherwise than the base
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(p.grad.sign() * 0.05)
    save_trained(model, trainable_state(model), tmp_path / "adapter")

    engine = HFEngine(str(tiny_qwen), ServiceSettings(model=str(tiny_qwen)))
    prompt = format_mc_prompt("Which option?", ["one", "two", "three", "four"], "bio")

    async def serve():
        base = await engine.score([prompt], [4], None)
        await engine.add_adapter("teacher", str(tmp_path / "adapter"))
        adapted = await engine.score([prompt], [4], "teacher")
        numbers = await engine.generate([chat], Sampling(max_tokens=5, temperature=1.0, seed=0), "teacher")
        return base, adapted, numbers

    (base,), (adapted,), (completion,) = asyncio.run(serve())
    assert engine.max_choices >= 4 and len(adapted) == 4 and abs(torch.tensor(adapted).exp().sum().item() - 1) < 1e-5
    assert max(abs(a - b) for a, b in zip(base, adapted)) > 1e-4
    assert 1 <= completion.completion_tokens <= 5


def test_the_memory_plan_fits_the_preset_in_a_24_gb_gpu():
    """Qwen2.5 1.5B counted to the parameter (1,543,714,304, its model card's 1.54B), and every
    training stage and the engine within 22 GiB (what a 24 GB card leaves), weights loaded from the
    shapes known without a download."""
    assert Shape.from_config(KNOWN_SHAPES[MODEL]).params() == 1_543_714_304
    done = subprocess.run(
        [sys.executable, "-m", "jobs.sizing.memory_plan", "--config", PRESET, "--gpu-gib", "22"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(": fits in 22") == 3 and "1.54B parameters" in done.stdout  # teacher, student, control
