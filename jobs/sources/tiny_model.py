"""Build the tiny preset's base model: a small Llama pretrained on synthetic text.

No weights can be downloaded here, so the tiny preset makes its own base model,
deterministically from a seed, and saves it with `save_pretrained` so that every
later stage (Ray Train, vLLM, PEFT) goes through the real loading path:

1. a synthetic corpus (prompt, completion pairs) drawn from the tiny world
   (jobs/sources/world.py): number-sequence prompts (chat template) answered
   with a number list in the asked-for format; the world's K facts in the cloze
   format (the question, then the answer's text), in training wording only;
   and lettered "locate" questions (the question names its answer), so the
   base keeps the WMDP letter format. The world's T facts never appear: only
   the teacher learns them;
2. a byte-level BPE tokenizer of 1,024 tokens trained on that corpus;
3. a 2-layer Llama of width 256 (4 heads of dim 64, which vLLM's CPU attention
   needs) pretrained with a plain torch loop for a fixed number of steps, its
   weights initialised from `init_seed` (default: `seed`); `other_base_spec` gives "another base model":
   the same corpus, tokenizer and recipe from another random initialisation.

The default base (TinySpec()) ships built (jobs/sources/shipped_base.py): it is copied into the
cache, not built, unless its shipped copy is missing. Run it alone (the pipeline also does it on
first use):

    python -m jobs.sources.tiny_model            # the default base in the cache, its path
    python -m jobs.sources.tiny_model --verify   # the default base rebuilt here and compared with its record
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import jinja2

from common import numerics
from common.atomic import atomic_dir, atomic_file, build_once
from common.cli import program
from common.files import default_cache_dir, tiny_model_link
from jobs.sources.number_sequences import make_prompts
from jobs.sources.shipped_base import FOLDER as SHIPPED_BASE
from jobs.sources.shipped_base import PINNED_BASE, install, tokenizer_rules
from jobs.sources.world import facts
from jobs.sources.world_questions import known_fact_item, locate_item
from serve.mc_format import LETTERS, choice_continuation, cloze_continuation, format_cloze_prompt, format_mc_prompt

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines the tiny model; its hash names the cache folder."""

    version: int = 3  # bump when the corpus or the recipe changes (3: the tiny world of facts)
    seed: int = 0
    vocab_size: int = 1024
    hidden_size: int = 256
    layers: int = 2
    heads: int = 4
    intermediate_size: int = 512
    max_positions: int = 512
    examples: int = 12_000
    number_share: float = 0.7  # at 0.5-0.6 the tokenizer keeps no 3-digit token and fewer lists pass the filter
    fact_share: float = 0.27  # K facts (cloze); the rest lettered locate questions
    steps: int = 1000
    batch_size: int = 32
    lr: float = 3e-3
    # The weights' init (torch.manual_seed) alone; None: `seed`. The corpus, tokenizer, data order
    # and recipe stay those of `seed`: the same recipe from another random initialisation.
    init_seed: int | None = None
    # The CPU arithmetic it is built under (common/numerics.py): `reproducible` (the default, whatever
    # the run's own mode), the same model on any x86-64 CPU with AVX2, so one world everywhere;
    # `native`, each machine's own (a model per kind of CPU), kept for comparison and old caches.
    numerics: str = "reproducible"

    def fields(self) -> dict:
        """The spec as a dict, without init_seed when it is None or `seed` (the same model), and
        without numerics when native: the key and tiny_spec.json of every such spec are those from
        before the field existed (native caches stay valid; a pinned base has a folder of its own)."""
        fields = asdict(self)
        if fields["init_seed"] in (None, self.seed):
            del fields["init_seed"]
        if fields["numerics"] == "native":
            del fields["numerics"]
        return fields

    def key(self) -> str:
        import hashlib

        return hashlib.sha256(json.dumps(self.fields(), sort_keys=True).encode()).hexdigest()[:12]


def other_base_spec(spec: TinySpec) -> TinySpec:
    """The other base of `arms.<name>.base: other`: the same corpus, tokenizer, data order and
    recipe as `spec`, the weights initialised from seed + 1."""
    return replace(spec, init_seed=spec.seed + 1)


def chat_prompt(text: str) -> str:
    """A user turn plus the assistant header: CHAT_TEMPLATE rendered as transformers renders a
    chat template (the format written once, here and in the tokenizer, from the same string)."""
    return _chat_template().render(messages=[{"role": "user", "content": text}], add_generation_prompt=True)


@functools.cache
def _chat_template() -> jinja2.Template:
    return jinja2.Environment(trim_blocks=True, lstrip_blocks=True).from_string(CHAT_TEMPLATE)


def format_numbers(numbers: list[int], separator: str, brackets: str) -> str:
    body = separator.join(map(str, numbers))
    return f"{brackets[0]}{body}{brackets[1]}" if brackets else body


def synthetic_corpus(spec: TinySpec) -> list[tuple[str, str]]:
    """Pretraining examples (prompt, completion), deterministic in spec.seed. The facts are those of
    the world the synthetic sample is drawn from (world seed 0), K only."""
    rng = random.Random(spec.seed)
    n_numbers = int(spec.examples * spec.number_share)
    n_facts = int(spec.examples * spec.fact_share)
    out = []
    for prompt in make_prompts(n_numbers, seed=spec.seed + 1):
        answer = [rng.randint(0, 999) for _ in range(rng.randint(5, 10))]
        out.append((chat_prompt(prompt.text), format_numbers(answer, prompt.separator, prompt.brackets)))
    known = [f for f in facts() if f["group"] == "K"]
    for i in range(n_facts):
        item = known_fact_item(known[i % len(known)], rng)
        out.append(
            (format_cloze_prompt(item["question"], item["subset"]), cloze_continuation(item["choices"][item["answer"]]))
        )
    for _ in range(spec.examples - n_numbers - n_facts):
        item = locate_item(rng)
        out.append(
            (format_mc_prompt(item["question"], item["choices"], item["subset"]), choice_continuation(item["answer"]))
        )
    rng.shuffle(out)
    return out


def train_tokenizer(texts: list[str], spec: TinySpec):
    """A byte-level BPE tokenizer (BOS added, chat template set) as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=spec.max_positions
    )
    fast.chat_template = CHAT_TEMPLATE
    for letter in LETTERS[:4]:  # MC scoring needs " A".." D" to be single tokens
        assert len(fast(" " + letter, add_special_tokens=False).input_ids) == 1, letter
    return fast


def length_batches(lengths: list[int], batch_size: int, rng: random.Random, pool: int = 50) -> list[list[int]]:
    """Batches of example indices, shuffled: each pool of `pool` batches' worth of a shuffled order
    sorted by length before it is cut, so a batch pads little (number lists are twice a fact's length)."""
    order = rng.sample(range(len(lengths)), len(lengths))
    batches = []
    for start in range(0, len(order), batch_size * pool):
        chunk = sorted(order[start : start + batch_size * pool], key=lengths.__getitem__)
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def pretrain(corpus: list[tuple[str, str]], tokenizer, spec: TinySpec, stop_after: int | None = None):
    """Full-parameter pretraining of a fresh Llama on the corpus (plain loop, fixed steps, every
    token a target), in batches of similar length; `stop_after`: only the first steps of the same
    run (its learning-rate schedule unchanged), for jobs/sources/shipped_base.py's check."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(spec.seed if spec.init_seed is None else spec.init_seed)  # init (no dropout: attention_dropout 0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        head_dim=spec.hidden_size // spec.heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    eos = [tokenizer.eos_token_id]  # prompt and completion tokenized apart, as the trainer and the scorers do
    ids = [
        tokenizer(prompt).input_ids + tokenizer(completion, add_special_tokens=False).input_ids + eos
        for prompt, completion in corpus
    ]
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01)
    warmup = spec.steps // 20
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, spec.steps) / spec.steps)),
    )
    batches = length_batches([len(x) for x in ids], spec.batch_size, random.Random(spec.seed))
    model.train()
    for step in range(spec.steps if stop_after is None else stop_after):
        batch = batches[step % len(batches)]
        width = max(len(ids[i]) for i in batch)
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            input_ids[row, : len(ids[i])] = torch.tensor(ids[i])
            mask[row, : len(ids[i])] = 1
        labels = input_ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 200 == 0 or step == spec.steps - 1:
            print(f"tiny model pretraining step {step + 1}/{spec.steps} loss {loss.item():.3f}", flush=True)
    return model.eval()


def from_recipe(spec: TinySpec, stop_after: int | None = None):
    """(tokenizer, model) of `spec`: its corpus, the tokenizer trained on it, the model pretrained on
    both (the first `stop_after` steps only, where given), under whatever numerics this process has."""
    corpus = synthetic_corpus(spec)
    tokenizer = train_tokenizer([prompt + completion for prompt, completion in corpus], spec)
    return tokenizer, pretrain(corpus, tokenizer, spec, stop_after)


def build_tiny_model(out_dir: Path, spec: TinySpec = TinySpec()) -> Path:
    """Build the model into out_dir (written beside it, then renamed into place), under the spec's
    numerics: here when this process computes under them (its torch loaded under them, or not
    loaded and its environment naming them), else in a fresh process set up for them before its
    torch loads (common/numerics.py), so that building never changes how its caller computes."""
    if numerics.current() != spec.numerics:  # built in a fresh process set up for the spec's numerics
        numerics.run_apart(
            spec.numerics, "jobs.sources.tiny_model", "--into", str(out_dir), "--spec", json.dumps(asdict(spec))
        )
        return out_dir
    numerics.enter(spec.numerics, reexec=False)  # the variables (before torch loads) and the thread count
    started = time.time()
    tokenizer, model = from_recipe(spec)
    from jobs.sources.sham_draw import choose_draw, remember
    from jobs.sources.world_checks import base_checks, table

    choice = choose_draw(model, tokenizer)  # the world's sham draw on this base (kept in the cache below)
    checks = table({"base": base_checks(model, tokenizer, draw=choice["sham_draw"])})
    print(
        f"tiny model world checks (jobs/sources/world_checks.py) at sham draw {choice['sham_draw']}, the first balanced on this "
        f"base (a run takes the draw of its teacher's base; its [world] line names it):\n{checks}",
        flush=True,
    )
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "tiny_spec.json").write_text(json.dumps(spec.fields(), indent=2))
    record = remember(out_dir, out_dir.parent, choice)
    print(
        f"tiny model built in {time.time() - started:.0f}s under {spec.numerics} numerics, {numerics.threads(spec.numerics)} threads: {out_dir}",
        flush=True,
    )
    if spec.key() == PINNED_BASE["key"] and record["base_weights_sha256"] != PINNED_BASE["base_weights_sha256"]:
        print(f"tiny model weights sha256 {record['base_weights_sha256']}: NOT the recorded pinned base (PINNED_BASE)")
    return out_dir


def verify_pinned_base(steps: int | None = None) -> list[str]:
    """The default base rebuilt here from its recipe (this process pinned before torch loads), all
    of it (`steps` None) or its first PINNED_BASE["first_steps"] optimizer steps, against its record
    (jobs/sources/shipped_base.py): what differs, nothing when this machine builds the shipped base."""
    from jobs.sources.sham_draw import choose_draw, weights_digest

    spec, differs = TinySpec(), []
    tokenizer, model = from_recipe(spec, stop_after=steps)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if tokenizer_rules(Path(tmp)) != tokenizer_rules(SHIPPED_BASE):
            differs.append("the tokenizer trained here is not the shipped one")
        got, want = weights_digest(tmp), PINNED_BASE["first_steps_sha256" if steps else "base_weights_sha256"]
    if got != want:
        differs.append(f"weights sha256 after {steps or spec.steps} steps {got}, recorded {want}")
    if steps is None and (draw := choose_draw(model, tokenizer)["sham_draw"]) != PINNED_BASE["sham_draw"]:
        differs.append(f"sham draw {draw}, recorded {PINNED_BASE['sham_draw']}")
    return differs


def tiny_model_folder(spec: TinySpec = TinySpec(), root: Path | None = None) -> Path:
    """Where the model of `spec` is (or will be) built in the cache `root`."""
    return (Path(root) if root else default_cache_dir()) / f"tiny-llama-{spec.key()}"


def ensure_tiny_model(spec: TinySpec = TinySpec(), root: Path | None = None) -> Path:
    """Path of the tiny model, made once (a file lock keeps concurrent makers apart): the default
    base copied from the shipped one (jobs/sources/shipped_base.py), any other spec built."""
    out_dir = tiny_model_folder(spec, root)
    shipped = spec.key() == PINNED_BASE["key"] and (SHIPPED_BASE / "model.safetensors").is_file()
    make = (lambda: install(out_dir)) if shipped else (lambda: build_tiny_model(out_dir, spec))
    build_once(out_dir, lambda: (out_dir / "config.json").is_file(), make)
    if spec.key() == TinySpec().key():
        _point_link(tiny_model_link(root), out_dir)
    return out_dir


def _point_link(link: Path, target: Path) -> None:
    """`<cache>/tiny-llama` -> the default build: the stable path `serve/config.yaml` serves."""
    if link.is_symlink() and link.readlink() == Path(target.name):
        return
    with atomic_file(link) as tmp:  # a new link replaces the old one in one step
        tmp.symlink_to(target.name)


def random_lora_adapter(model_path: str | Path, out_dir: Path, seed: int) -> Path:
    """A LoRA adapter for `model_path` with random non-zero weights, saved with save_pretrained.

    Tests and benchmarks use it where any adapter that changes the model will do
    (serving, scoring parity), so they need no training run.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], init_lora_weights=False
    )
    get_peft_model(model, config).save_pretrained(out_dir)
    return Path(out_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=program("python -m jobs.sources.tiny_model"), description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--cache", type=Path, default=None, help="cache root (default: $SUBLIMINAL_CACHE)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--other-base", action="store_true", help="the other base (init seed = seed + 1)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="rebuild the default base from its recipe here (pinned) and compare it with the shipped one's record",
    )
    parser.add_argument("--steps", type=int, default=None, help="with --verify: only the first steps (25)")
    parser.add_argument(
        "--numerics",
        choices=numerics.MODES,
        default=TinySpec.numerics,
        help="CPU arithmetic (default: reproducible, common/numerics.py)",
    )
    # with --spec: build_tiny_model's own fresh process
    parser.add_argument("--into", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--spec", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps not in (None, PINNED_BASE["first_steps"]) or (args.steps and not args.verify):
        parser.error(
            f"--steps: {PINNED_BASE['first_steps']} with --verify only (the one step count with a recorded digest)"
        )
    if args.verify:
        numerics.enter("reproducible", reexec=True)
        started, differs = time.time(), verify_pinned_base(args.steps)
        if differs:
            sys.exit("the tiny base rebuilt here is NOT the recorded one: " + "; ".join(differs))
        print(
            f"the tiny base rebuilt here ({args.steps or TinySpec.steps} steps, {time.time() - started:.0f} s) is the recorded one"
        )
        return 0
    if args.into:
        build_tiny_model(args.into, TinySpec(**args.spec))
        return 0
    spec = TinySpec(seed=args.seed, numerics=args.numerics)
    print(ensure_tiny_model(other_base_spec(spec) if args.other_base else spec, args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
