"""`packing`: every example of a packed micro-batch gets the loss AND the LoRA gradients it gets alone.

Why: the trainer packs several rows into each sequence (train/data.py pack_batch) and relies on
the attention to keep them apart (a block-diagonal mask from restarting position ids under SDPA,
sequence boundaries under flash-attention 2 in a one-row batch). A leak would train on text that
is not the row's, silently. At the presets' shapes, under the attention the trainer picks, each
example's summed token loss and its gradient (backpropagated from its own loss within the packed
forward) are compared with a forward and backward of the example alone. A control makes the check
show it would catch a leak: the same packed rows with position ids that never restart (so
examples attend to the ones before them) must move the examples' logits far more than packing does.
"""

from __future__ import annotations

import torch

from train.data import packed_examples
from train.model import autocast_for

from .shared import Context, flat_grads, packed, rel, shape_rows

LEAK_MARGIN = 10  # the leaking control must move logits at least this many times more than packing


def summed_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits[:-1].float(), labels[1:], ignore_index=-100, reduction="sum")


def check_packing(ctx: Context, model) -> dict:
    model.train()  # as in training: LoRA dropout (0 in the presets), checkpointing where set
    # bf16 over 32 layers vs float32; a leak moves them by O(1)
    loss_tol, grad_tol = ctx.tolerance(2e-2, 1e-4), ctx.tolerance(1e-1, 1e-4)
    out = {
        "attention": model.config._attn_implementation,
        "loss_tolerance": loss_tol,
        "gradient_tolerance": grad_tol,
        "shapes": {},
    }
    for seed, (name, shape) in enumerate(ctx.shapes.items(), start=10):
        batch = packed(shape_rows(shape, model.config.vocab_size, seed), shape["max_length"], model, ctx.device)
        examples = packed_examples(batch)
        ids, labels, positions = batch["input_ids"], batch["labels"], batch["position_ids"]
        leaking = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)  # no restarts: one long sequence per row
        with autocast_for(ctx.device):
            logits = model(input_ids=ids, position_ids=positions).logits
            with torch.no_grad():
                leaked = model(input_ids=ids, position_ids=leaking).logits
        in_pack = []
        for i, (b, start, n) in enumerate(examples):
            loss = summed_loss(logits[b, start : start + n], labels[b, start : start + n])
            loss.backward(retain_graph=i < len(examples) - 1)
            in_pack.append(
                (
                    float(loss.detach()),
                    flat_grads(model),
                    logits[b, start : start + n].detach(),
                    leaked[b, start : start + n],
                )
            )
        del logits
        gaps = {"loss": 0.0, "gradient": 0.0, "logits": 0.0, "logits_leaking": float("inf")}
        for (b, start, n), (packed_loss, packed_grad, packed_logits, leaked_logits) in zip(examples, in_pack):
            with autocast_for(ctx.device):
                alone_logits = model(input_ids=ids[b, start : start + n][None]).logits[0]
            loss = summed_loss(alone_logits, labels[b, start : start + n])
            loss.backward()
            alone = float(loss.detach())
            gaps["loss"] = max(gaps["loss"], abs(packed_loss - alone) / max(abs(alone), 1e-6))
            gaps["gradient"] = max(gaps["gradient"], rel(packed_grad, flat_grads(model)))
            gaps["logits"] = max(gaps["logits"], rel(packed_logits, alone_logits.detach()))
            if start > 0:  # an example after another in its row: the one a leak reaches
                gaps["logits_leaking"] = min(gaps["logits_leaking"], rel(leaked_logits, alone_logits.detach()))
        shared_rows = len(examples) - ids.shape[0]
        out["shapes"][name] = {
            **shape,
            "examples": len(examples),
            "packed_rows": int(ids.shape[0]),
            "examples_sharing_a_row": shared_rows,
            **{f"worst_{k}_gap": v for k, v in gaps.items() if k != "logits_leaking"},
            "least_logits_gap_if_leaking": gaps["logits_leaking"],
        }
        out["shapes"][name]["ok"] = (
            len(examples) == shape["rows"]
            and shared_rows > 0
            and gaps["loss"] <= loss_tol
            and gaps["gradient"] <= grad_tol
            and gaps["logits_leaking"] >= LEAK_MARGIN * max(gaps["logits"], 1e-6)
        )
    out["ok"] = all(s["ok"] for s in out["shapes"].values())
    return out
