"""The memory plan's activation terms (jobs/sizing/shape.py), measured tensor by tensor.

A tiny Llama with grouped KV heads, saved with save_pretrained and loaded through
train.model.load_base and attach_lora, runs train.step.forward_loss with
torch.autograd.graph.saved_tensors_hooks catching every tensor autograd saves for
backward. Each is put down to where it was first saved: before the first decoder layer
("embedding"), RoPE's cos and sin ("rope"), a decoder layer (from the end of the one
before it, so a checkpointed layer's saved input is its own), or after the last
("head": final norm, lm_head, loss). Each storage counts once (views and tensors that
share one are one allocation), and the model's weights, or views of them, not at all.
Two batch sizes part what grows with the tokens (bytes per token, compared with
Shape.layer_activations and Shape.outer_activations) from what does not (weight copies,
compared with Shape.weight_copies). Both must agree to the byte: dropping or
mis-sizing any term fails.

Three ways to run it, each with its plan's Precision:
- float32: as train.model runs on a CPU, float32 throughout.
- bf16: as on a GPU over a bf16 base: load_base's bf16 weights (float32 under full
  fine-tuning) and attach_lora's float32 adapter, under bf16 autocast (the CPU's: the
  ops whose dtype matters here, linear and scaled_dot_product_attention, are cast by
  CPU and CUDA autocast alike; pow and log_softmax already get float32 inputs).
- 4bit: as on a GPU over a 4-bit base, which bitsandbytes cannot make here (it needs
  CUDA): each projection keeps a frozen bf16 weight (its dequantized NF4) behind
  Linear4bit's forward (input to bf16, output back to the input's dtype; its
  MatMul4Bit saves no activation, as a frozen weight's matmul does not either), the
  embeddings, norms and lm_head stay float32 (what prepare_model_for_kbit_training
  upcasts them to), and PEFT's input cast is off, as in its 4-bit LoRA layer under
  CUDA autocast.

Attention: SDPA over rows of one sequence each (no mask) saves what flash-attn 2 does on
a GPU (q, k and v at their widths, the output, the logsumexp), so it stands for
"flash"; over packed rows (the block-diagonal mask) it is "sdpa"; and "eager".
"""

import collections
import contextlib
import types

import pytest
import torch

from jobs.sizing.shape import Precision, Shape
from train.config import TrainConfig

SEQ = 12
ALL = TrainConfig().lora_targets  # the seven projections
SOME = ["q_proj", "v_proj", "down_proj"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
    )
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


def linear4bit_forward(self, x):
    """bitsandbytes' Linear4bit.forward, as autograd sees it: the input cast to the compute dtype,
    the matmul, the output cast back to the input's dtype."""
    return torch.nn.functional.linear(x.to(torch.bfloat16), self.weight).to(x.dtype)


def load(path: str, train: TrainConfig, regime: str):
    """The model `train` trains, loaded through train.model and set up as `regime` runs it (module docstring)."""
    from train.model import attach_lora, load_base

    model = load_base(path, train, torch.device("cpu"))
    if regime == "bf16" and train.method == "lora":
        model.to(torch.bfloat16)  # load_base's dtype on CUDA (full fine-tuning loads float32 anywhere)
    if regime == "4bit":
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name != "lm_head":
                module.weight.data = module.weight.data.to(torch.bfloat16)
                module.forward = types.MethodType(linear4bit_forward, module)
        if train.gradient_checkpointing:
            model.enable_input_require_grads()  # what prepare_model_for_kbit_training does then
    model = attach_lora(model, train) if train.method == "lora" else model
    return model.train()


def saved_bytes(model, rows: int, packed: bool, regime: str) -> collections.Counter:
    """Bytes autograd saves in one forward_loss of `rows` rows of SEQ tokens, by where (module docstring)."""
    from peft.helpers import disable_input_dtype_casting

    from train.step import forward_loss

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = base.model.layers
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    where, seen, rope, saved = ["embedding"], set(), set(), collections.Counter()

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            saved["rope" if storage.data_ptr() in rope else where[0]] += storage.nbytes()
        return tensor

    def after(i):
        return lambda *_: where.__setitem__(0, f"layer {i + 1}" if i + 1 < len(layers) else "head")

    hooks = [
        base.model.embed_tokens.register_forward_hook(after(-1)),
        base.model.rotary_emb.register_forward_hook(
            lambda module, args, out: rope.update(t.untyped_storage().data_ptr() for t in out)
        ),
        *(layer.register_forward_hook(after(i)) for i, layer in enumerate(layers)),
    ]
    ids = torch.randint(0, base.config.vocab_size, (rows, SEQ), generator=torch.Generator().manual_seed(rows))
    positions = torch.arange(SEQ) % (SEQ // 2) if packed else torch.arange(SEQ)  # packed: two sequences a row
    batch = {"input_ids": ids, "labels": ids, "position_ids": positions.expand(rows, SEQ)}
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if regime != "float32" else contextlib.nullcontext()
    try:
        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
            autocast,
            disable_input_dtype_casting(model, regime == "4bit"),
        ):
            forward_loss(model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    return saved


CASES = [
    ("float32", "lora", ALL, False, "flash"),
    ("float32", "lora", SOME, False, "flash"),
    ("float32", "lora", ALL, False, "sdpa"),
    ("float32", "lora", ALL, False, "eager"),
    ("float32", "lora", ALL, True, "flash"),
    ("float32", "full", ALL, False, "sdpa"),
    ("bf16", "lora", ALL, False, "flash"),
    ("bf16", "lora", SOME, False, "sdpa"),
    ("bf16", "lora", ALL, False, "eager"),
    ("bf16", "lora", ALL, True, "sdpa"),
    ("bf16", "full", ALL, False, "flash"),
    ("4bit", "lora", ALL, False, "flash"),
    ("4bit", "lora", SOME, False, "sdpa"),
    ("4bit", "lora", ALL, True, "flash"),
]


@pytest.mark.parametrize(
    "regime, method, targets, checkpointing, kernel",
    CASES,
    ids=["-".join(map(str, c[:2] + (len(c[2]), c[3], c[4]))) for c in CASES],
)
def test_every_saved_tensor_is_in_the_plan_layer_by_layer(llama, regime, method, targets, checkpointing, kernel):
    """Per token, each decoder layer's saved bytes are Shape.layer_activations' (the first layer's without its
    input norm when its input needs no gradient; under checkpointing its input alone), and the rest outer_activations'."""
    from transformers import AutoConfig

    train = TrainConfig(
        method=method,
        lora_rank=8,
        lora_targets=list(targets),
        gradient_checkpointing=checkpointing,
        attention="eager" if kernel == "eager" else "sdpa",
    )
    model = load(llama, train, regime)
    # Rows of 2 and 4 (of one row, the labels' shifted slice is contiguous and keeps its padded storage)
    two, four = (saved_bytes(model, rows, packed=kernel != "flash", regime=regime) for rows in (2, 4))
    measured = {part: (four[part] - two[part]) / (2 * SEQ) for part in two | four}  # bytes per token
    fixed = {part: 2 * two[part] - four[part] for part in two | four}  # bytes whatever the tokens

    shape = Shape.from_config(AutoConfig.from_pretrained(llama).to_dict())
    p = Precision.of(
        train.replace(quantization="4bit") if regime == "4bit" else train, gpu=regime != "float32", attention=kernel
    )
    outer = shape.outer_activations(p)
    expected = {
        "embedding": outer["embedding"],
        "rope": 0 if checkpointing else outer["rope"],  # under checkpointing held by the layers' arguments, not saved
        **{
            f"layer {i}": sum(
                shape.layer_activations(
                    p, SEQ, input_grad=i > 0 or method == "full" or checkpointing, checkpointed=checkpointing
                ).values()
            )
            for i in range(shape.layers)
        },
        "head": outer["final norm"] + outer["lm_head input"] + outer["loss"],
    }
    assert {part: measured.get(part, 0) for part in expected} == expected

    copies = shape.weight_copies(p)
    per_layer = 0 if checkpointing else copies["layer"]  # a checkpointed layer's copies are saved only in its recompute
    assert [fixed.get(f"layer {i}", 0) for i in range(1, shape.layers)] == [per_layer] * (shape.layers - 1)
    # without input gradients the first layer's q/k/v keep their LoRA A copies unsaved
    assert fixed.get("layer 0", 0) <= per_layer
    # The head's: lm_head's weight copy, and nll_loss's float32 total weight, one scalar
    assert fixed.get("head", 0) == copies["lm_head"] + 4 and fixed.get("embedding", 0) == fixed.get("rope", 0) == 0


@pytest.mark.parametrize("regime", ["float32", "bf16"])
def test_the_loss_backward_holds_three_float32_logit_sized_tensors(llama, regime):
    """At the loss's backward, log_softmax's saved float32 output, nll_loss's gradient into it and
    log_softmax's own gradient are alive together: the plan's "loss" and "loss backward"."""
    from transformers import AutoConfig

    from train.step import forward_loss

    train = TrainConfig(lora_rank=8)
    model = load(llama, train, regime)
    shape = Shape.from_config(AutoConfig.from_pretrained(llama).to_dict())
    ids = torch.randint(0, shape.vocab, (2, SEQ), generator=torch.Generator().manual_seed(0))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if regime == "bf16" else contextlib.nullcontext()
    with autocast:
        loss = forward_loss(model, {"input_ids": ids, "labels": ids, "position_ids": torch.arange(SEQ).expand(2, SEQ)})
    nodes, node = [loss.grad_fn], None
    while node is None or node.name() != "LogSoftmaxBackward0":
        node = nodes.pop()
        nodes += [n for n, _ in node.next_functions if n is not None]
    held = {"saved": node._saved_result}
    node.register_hook(lambda grad_in, grad_out: held.update(grad_in=grad_in[0], grad_out=grad_out[0]))
    loss.backward()

    outer = shape.outer_activations(Precision.of(train, gpu=regime == "bf16"))
    tokens = 2 * SEQ
    assert {k: t.dtype for k, t in held.items()} == dict.fromkeys(held, torch.float32)
    assert held["saved"].nbytes == (outer["loss"] - 8) * tokens  # the rest of "loss": the int64 labels
    assert held["grad_in"].nbytes + held["grad_out"].nbytes == outer["loss backward"] * tokens
