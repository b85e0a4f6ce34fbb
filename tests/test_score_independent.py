"""The scored columns against an independent forward pass (issue 29): a plain Hugging Face
forward of the prompt + each answer string, with the answer-span log-probability summed by hand
(no probeselect scoring code), so a column taken from the wrong candidate or a swapped
per-token denominator cannot agree with itself."""

import json

import numpy as np
import pytest
import torch

from probeselect import score_checkpoints
from probeselect.checkpoints import discover_checkpoints


def _span_logprob(model, tok, prompt: str, answer: str) -> tuple[float, int]:
    """Summed log p(answer tokens | prompt) and the answer's token count, lm-eval style: the
    answer's tokens are those of tok(prompt + answer) after the tokens of tok(prompt)."""
    ctx = tok(prompt)["input_ids"]
    whole = tok(prompt + answer)["input_ids"]
    assert whole[:len(ctx)] == ctx, (prompt, answer)
    ids = torch.tensor([whole])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    total = sum(float(logp[pos - 1, whole[pos]]) for pos in range(len(ctx), len(whole)))
    return total, len(whole) - len(ctx)


@pytest.fixture(scope="module")
def scored_last(tiny_ladder, arith_spec, tmp_path_factory):
    ckpt = discover_checkpoints(tiny_ladder)[-1]
    out = tmp_path_factory.mktemp("indep") / "run"
    res = score_checkpoints([ckpt], [arith_spec], seeds=[0], out=out, progress=False, audit_items=0)
    items = {d["item_id"]: d for d in map(json.loads, (out / "items.jsonl").read_text().splitlines())}
    return ckpt, res.scores, items


def test_task_and_shortcut_columns_match_an_independent_forward_pass(scored_last):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt, s, items = scored_last
    tok = AutoTokenizer.from_pretrained(ckpt.path)
    model = AutoModelForCausalLM.from_pretrained(ckpt.path, torch_dtype=torch.float32).eval()
    assert len(s) == len(items) == 6 * 3
    n_diff_tokens = n_three_distinct = 0
    for r in s.itertuples():
        it = items[r.item_id]
        # the shortcut is found by its string, not by its position among the candidates
        task_lp, task_n = _span_logprob(model, tok, it["prompt"], it["task_answer"])
        short_lp, short_n = _span_logprob(model, tok, it["prompt"], it["shortcut_answer"])
        others = [_span_logprob(model, tok, it["prompt"], c)[0] for c in it["candidates"]
                  if c not in (it["task_answer"], it["shortcut_answer"])]
        assert r.task_logprob == pytest.approx(task_lp, abs=1e-4), ("task_logprob", r.item_id, r.task_logprob, task_lp)
        assert r.shortcut_logprob == pytest.approx(short_lp, abs=1e-4), ("shortcut_logprob", r.item_id,
                                                                          r.shortcut_logprob, short_lp)
        assert (r.task_tokens, r.shortcut_tokens) == (task_n, short_n), r.item_id
        assert r.margin == pytest.approx(task_lp - short_lp, abs=2e-4), ("margin", r.item_id, r.margin)
        expected = task_lp / task_n - short_lp / short_n
        assert r.margin_per_token == pytest.approx(expected, abs=2e-4), ("margin_per_token", r.item_id,
                                                                         r.margin_per_token, expected)
        n_diff_tokens += task_n != short_n
        n_three_distinct += bool(others) and min(abs(o - short_lp) for o in others) > 1e-2
    # the checks above can only catch a wrong candidate or swapped denominators if the inputs let them
    assert n_diff_tokens >= 3 and n_three_distinct >= 3, (n_diff_tokens, n_three_distinct)
