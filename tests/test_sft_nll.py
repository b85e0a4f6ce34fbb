"""The supervised-positions NLL (probeselect.sft._nll): equal to the full-logits cross-entropy, with the
same gradients, and the full logits used for a model whose logits are not its head's output."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from _sft_helpers import prepared, small_recipe
from probeselect.sft._nll import _FLAG, head_is_plain, supervised_nll
from probeselect.sft.batched import pack_rows
from probeselect.sft.data import IGNORE, collate


def reference_nll(model, batch) -> torch.Tensor:
    """The textbook loss: full logits, shifted, IGNORE dropped, per supervised token (row-major)."""
    if "position_ids" in batch:
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    else:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    targets = batch["labels"][:, 1:]
    sel = targets != IGNORE
    return F.cross_entropy(logits[:, :-1][sel].float(), targets[sel], reduction="none")


@pytest.fixture(scope="module")
def batches(tiny_ladder):
    recipe = small_recipe(tiny_ladder)
    _, tok, ex, m = prepared(tiny_ladder, recipe, seed=0)
    exs = [ex[i] for i in m["steps"][0]["ids"][:6]]
    padded = collate(exs, tok.pad_token_id)
    packed, _ = pack_rows([exs[:3], exs[3:]], tok.pad_token_id, max(len(e.input_ids) for e in exs))
    return {"padded": padded, "packed": packed}


def _model(ladder_checkpoints):
    from probeselect.score import load_model

    return load_model(ladder_checkpoints[-1], torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_supervised_nll_equals_full_logits_loss_and_gradient(layout, batches, ladder_checkpoints):
    batch = batches[layout]
    model = _model(ladder_checkpoints)
    for p in model.parameters():
        p.requires_grad_(True)
    ref = reference_nll(model, batch)
    ref.sum().backward()
    ref_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    nll, rows = supervised_nll(model, batch)
    assert getattr(model, _FLAG) is True  # the fast path was taken
    nll.sum().backward()
    targets = batch["labels"][:, 1:]
    assert rows.tolist() == (targets != IGNORE).nonzero()[:, 0].tolist()
    assert len(nll) == int((targets != IGNORE).sum()) > 0
    torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-6)
    for p, g in zip(model.parameters(), ref_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)


def test_logit_post_processing_is_detected_and_the_full_logits_used(batches, ladder_checkpoints):
    """A model whose logits are scaled after the head (as Cohere's ``logit_scale`` or Gemma's
    soft-capping do) must not be scored from ``head(hidden)``: the check warns and the loss is the
    full logits' (which the head-only shortcut would miss by a factor in the logits)."""
    batch = batches["padded"]
    model = _model(ladder_checkpoints).eval()

    def scale(_mod, _args, out):
        out.logits = out.logits * 3.0
        return out

    model.register_forward_hook(scale)
    with pytest.warns(UserWarning, match="not its output head"):
        nll, _ = supervised_nll(model, batch)
    assert getattr(model, _FLAG) is False
    with torch.no_grad():
        torch.testing.assert_close(nll, reference_nll(model, batch), rtol=1e-5, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # decided once per model: no second warning
        assert head_is_plain(model, batch) is False


def test_forward_without_logits_to_keep_uses_the_full_logits(batches, ladder_checkpoints):
    batch = batches["packed"]
    inner = _model(ladder_checkpoints).eval()

    class Old(torch.nn.Module):  # an older-style causal LM: no logits_to_keep, no get_decoder
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=use_cache)

    old = Old()
    with pytest.warns(UserWarning, match="logits_to_keep"):
        nll, _ = supervised_nll(old, batch)
    with torch.no_grad():
        torch.testing.assert_close(nll, reference_nll(inner, batch), rtol=1e-5, atol=1e-6)


def test_the_check_draws_no_random_numbers_and_restores_training_mode(batches, tiny_ladder):
    """The one-time check runs in eval mode: with LoRA dropout active, training draws the same random
    numbers as without the check (a resumed run re-checks on its first step and must not shift them)."""
    from probeselect.sft import loop as loop_mod

    recipe = small_recipe(tiny_ladder, method={"type": "lora", "r": 4, "alpha": 8, "dropout": 0.3})
    model = loop_mod._build_model(tiny_ladder / sorted(p.name for p in tiny_ladder.iterdir()
                                                       if p.name.startswith("checkpoint-"))[-1],
                                  recipe, 0, torch.device("cpu"))
    model.train()
    torch.manual_seed(7)
    before = torch.get_rng_state()
    assert head_is_plain(model, batches["padded"]) is True
    assert torch.equal(torch.get_rng_state(), before)
    assert model.training and all(m.training for m in model.modules())
