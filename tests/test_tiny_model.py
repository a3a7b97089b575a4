"""The tiny preset's base model: usable for number generation and multiple-choice format."""

from collections import Counter

import torch

from jobs.number_sequences import make_prompts, reject_reason
from jobs.tiny_model import TinySpec, chat_prompt, synthetic_corpus
from jobs.wmdp import synthetic_questions
from serve.hf_scoring import letter_token_ids
from serve.mc_format import format_mc_prompt


def test_corpus_is_deterministic():
    spec = TinySpec(examples=300)
    assert synthetic_corpus(spec) == synthetic_corpus(spec)
    assert synthetic_corpus(spec) != synthetic_corpus(TinySpec(examples=300, seed=1))


def test_number_completions_pass_the_filter(tiny_model):
    """At temperature 1.0 at least 30% of completions of unseen prompts pass (the target)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    assert tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True) == chat_prompt("x")
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": p.text}], tokenize=False, add_generation_prompt=True) for p in make_prompts(200, seed=98765)
    ]
    enc = tok(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=48, pad_token_id=tok.pad_token_id)
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    reasons = Counter(reject_reason(t) for t in texts)
    assert reasons[None] / len(texts) >= 0.30, reasons


def test_answers_multiple_choice_in_format(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    letters = letter_token_ids(tok, 4)
    rows = synthetic_questions(20, seed=5)
    enc = tok([format_mc_prompt(r["question"], r["choices"], r["subset"]) for r in rows], return_tensors="pt", padding=True)
    out = model.generate(**enc, do_sample=False, max_new_tokens=1, pad_token_id=tok.pad_token_id)
    assert all(t in letters for t in out[:, -1].tolist())
