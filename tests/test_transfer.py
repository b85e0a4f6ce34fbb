"""Mechanics of the held-out transfer evaluation on the tiny (untrained) toy ladder."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from probeselect.errors import TransferError
from probeselect.transfer import (
    METRICS,
    check_disjoint_from_probes,
    check_disjoint_from_sft,
    evaluate_transfer,
    greedy_decode,
    heldout_nll,
    load_transfer_items,
    recovered,
    summarize_transfer,
)


@pytest.fixture(scope="module")
def model_tok(ladder_checkpoints):
    from probeselect.score import load_model, load_tokenizer

    ck = ladder_checkpoints[-1]
    return load_model(ck, torch.float32, torch.device("cpu")), load_tokenizer(ck)


@pytest.fixture(scope="module")
def cfg(tiny_ladder, tmp_path_factory):
    """A small suite: the first rows of the toy ladder's files (keeps the tests fast)."""
    data = tiny_ladder / "data"
    return {"tasks": str(data / "transfer.jsonl"), "robustness": str(data / "robustness.jsonl"),
            "heldout": str(data / "sft_heldout.jsonl"), "max_new_tokens": 6, "max_items": 24, "batch_size": 8}


@pytest.fixture(scope="module")
def items_df(model_tok, cfg):
    model, tok = model_tok
    return evaluate_transfer(model, tok, cfg, device="cpu")


def _write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_metric_set_ranges_and_determinism(model_tok, cfg, items_df):
    model, tok = model_tok
    df = items_df
    assert list(df.columns) == ["item_id", "kind", "metric", "value", "weight"]
    assert set(df["metric"]) == set(METRICS)
    assert df.groupby("metric").size().to_dict() == {m: 24 for m in METRICS}
    for m in ("task_accuracy", "termination", "robust_recovery"):
        assert set(df.loc[df.metric == m, "value"]) <= {0.0, 1.0}
        assert (df.loc[df.metric == m, "weight"] == 1.0).all()
    lp = df.loc[df.metric == "task_logprob", "value"]
    assert (lp < 0).all() and (lp > -30).all()
    # an untrained model: held-out loss near the uniform level, never below 0
    vocab = model.config.vocab_size
    loss = df.loc[df.metric == "heldout_loss", "value"]
    assert (loss > 0).all() and (loss < 2 * math.log(vocab)).all()
    assert (df.loc[df.metric == "sft_heldout_bpb", "value"] > 0).all()
    again = evaluate_transfer(model, tok, cfg, device="cpu")
    pd.testing.assert_frame_equal(df, again)
    assert not model.training


def test_heldout_loss_equals_direct_hf_forward(model_tok, cfg, items_df):
    """Per-row heldout_loss = HF's mean cross-entropy over response tokens + EOS (prompt masked)."""
    model, tok = model_tok
    rows = load_transfer_items(cfg).heldout
    got = items_df[items_df.metric == "heldout_loss"].set_index("item_id")
    total_nats = total_tokens = total_bytes = 0.0
    for r in rows:
        ids = tok(r["prompt"] + r["response"])["input_ids"] + [tok.eos_token_id]
        n_ctx = len(tok(r["prompt"])["input_ids"])
        labels = torch.tensor([-100] * n_ctx + ids[n_ctx:])
        with torch.no_grad():
            loss = model(input_ids=torch.tensor([ids]), labels=labels[None]).loss.item()
        n_tok = len(ids) - n_ctx
        assert got.loc[r["id"], "value"] == pytest.approx(loss, abs=1e-5)
        assert got.loc[r["id"], "weight"] == n_tok
        total_nats += loss * n_tok
        total_tokens += n_tok
        total_bytes += len(r["response"].encode())
    summ = summarize_transfer(items_df).set_index("metric")
    assert summ.loc["heldout_loss", "value"] == pytest.approx(total_nats / total_tokens, abs=1e-5)
    assert summ.loc["sft_heldout_bpb", "value"] == pytest.approx(total_nats / math.log(2) / total_bytes, abs=1e-5)
    assert summ.loc["heldout_loss", "n"] == len(rows)


def test_format_prompt_is_applied(model_tok, cfg):
    model, tok = model_tok
    rows = load_transfer_items(cfg).heldout[:4]
    fmt = lambda p: "Hello.\n" + p  # noqa: E731
    nll = heldout_nll(model, tok, rows, format_prompt=fmt)
    for r, nats in zip(rows, nll["nats"]):
        ids = tok(fmt(r["prompt"]) + r["response"])["input_ids"] + [tok.eos_token_id]
        n_ctx = len(tok(fmt(r["prompt"]))["input_ids"])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        want = -sum(logp[i - 1, ids[i]].item() for i in range(n_ctx, len(ids)))
        assert nats == pytest.approx(want, abs=1e-4)


def test_greedy_decode_matches_uncached_argmax(model_tok, cfg):
    model, tok = model_tok
    prompts = [t["prompt"] for t in load_transfer_items(cfg).tasks[:5]] + ["1 + 2 ="]
    got = greedy_decode(model, tok, prompts, max_new_tokens=5, batch_size=4)
    for p, g in zip(prompts, got):
        ids = tok(p)["input_ids"]
        new = []
        for _ in range(5):
            with torch.no_grad():
                nxt = int(model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
            new.append(nxt)
            if nxt == tok.eos_token_id or "\n" in tok.decode([nxt]):
                break
        assert g.n_new_tokens == len(new)
        assert g.text == tok.decode(new).split("\n")[0].replace(tok.eos_token, "")


class _ForcedTokenModel(torch.nn.Module):
    """Wraps a causal LM and makes ``token`` the argmax once ``after`` tokens were generated."""

    def __init__(self, inner, token: int, after: int):
        super().__init__()
        self.inner, self.token, self.after = inner, token, after
        self.config = inner.config
        self.generation_config = inner.generation_config
        self.calls = 0

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                logits_to_keep=0):
        out = self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache, use_cache=use_cache, logits_to_keep=logits_to_keep)
        if input_ids.shape[1] == 1:
            self.calls += 1
        else:
            self.calls = 0
        if self.calls >= self.after:
            out.logits[..., self.token] = 1e4
        return out


def test_termination_detects_eos_and_newline(model_tok, cfg):
    model, tok = model_tok
    prompts = [t["prompt"] for t in load_transfer_items(cfg).tasks[:6]]
    forced = greedy_decode(_ForcedTokenModel(model, tok.eos_token_id, after=2), tok, prompts, max_new_tokens=6)
    assert all(g.stop == "eos" and g.n_new_tokens == 3 for g in forced)
    nl = tok.convert_tokens_to_ids(tok.tokenize("\n"))[0]
    newline = greedy_decode(_ForcedTokenModel(model, nl, after=0), tok, prompts, max_new_tokens=6)
    assert all(g.stop == "newline" and g.text == "" and g.n_new_tokens == 1 for g in newline)
    df = evaluate_transfer(_ForcedTokenModel(model, tok.eos_token_id, after=0), tok,
                           {"tasks": cfg["tasks"], "max_items": 6, "max_new_tokens": 6}, device="cpu")
    summ = summarize_transfer(df).set_index("metric")["value"]
    assert summ["termination"] == 1.0 and summ["task_accuracy"] == 0.0
    df = evaluate_transfer(_ForcedTokenModel(model, nl, after=0), tok,
                           {"tasks": cfg["tasks"], "max_items": 6, "max_new_tokens": 6}, device="cpu")
    assert summarize_transfer(df).set_index("metric").loc["termination", "value"] == 0.0


class _ScriptedModel(_ForcedTokenModel):
    """Wraps a causal LM and makes ``script[k]`` the argmax of generated token k, then ``end``."""

    def __init__(self, inner, script: list[int], end: int):
        super().__init__(inner, end, after=0)
        self.script = script

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, use_cache=None,
                logits_to_keep=0):
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              cache=cache, use_cache=use_cache, logits_to_keep=logits_to_keep)
        k = self.calls if input_ids.shape[1] == 1 else 0
        if k < len(self.script):
            out.logits[..., self.script[k]] = 2e4
        return out


def test_task_accuracy_counts_exact_matches(model_tok, cfg, tmp_path):
    """A suite whose references are the model's own greedy answers scores accuracy 1, and 0 when the
    references are something else. (The tiny test ladder answers with an empty line, so the model's
    answer is scripted: a real answer word, then a newline.)"""
    model, tok = model_tok
    tasks = load_transfer_items(cfg).tasks[:6]
    word = tasks[0]["response"].strip().rstrip(".").split()[-1]
    nl = tok.convert_tokens_to_ids(tok.tokenize("\n"))[0]
    scripted = _ScriptedModel(model, tok.encode(" " + word, add_special_tokens=False), end=nl)
    gens = greedy_decode(scripted, tok, [t["prompt"] for t in tasks], max_new_tokens=6)
    assert all(g.text.strip() == word and g.stop == "newline" for g in gens)
    rows = [{**t, "response": " " + g.text.strip() + "."} for t, g in zip(tasks, gens)]
    path = _write_jsonl(tmp_path / "own.jsonl", rows)
    df = evaluate_transfer(scripted, tok, {"tasks": str(path), "max_new_tokens": 6}, device="cpu")
    acc = df.loc[df.metric == "task_accuracy", "value"]
    assert len(acc) == len(rows) and (acc == 1.0).all()
    other = _write_jsonl(tmp_path / "other.jsonl", [{**t, "response": " " + word + "x."} for t in tasks])
    df = evaluate_transfer(scripted, tok, {"tasks": str(other), "max_new_tokens": 6}, device="cpu")
    assert (df.loc[df.metric == "task_accuracy", "value"] == 0.0).all()


def test_task_shortcut_rate_tells_the_shortcut_from_a_third_answer(model_tok, cfg, tmp_path):
    """task_shortcut_rate is 1 on a task whose greedy answer is its ``shortcut`` and 0 on one whose
    answer is a third string (both failed tasks: accuracy 0); a task without a shortcut has no row."""
    model, tok = model_tok
    tasks = load_transfer_items(cfg).tasks[:6]
    word = tasks[0]["response"].strip().rstrip(".").split()[-1]
    nl = tok.convert_tokens_to_ids(tok.tokenize("\n"))[0]
    scripted = _ScriptedModel(model, tok.encode(" " + word, add_special_tokens=False), end=nl)
    rows = ([{**t, "response": " wrong.", "shortcut": " " + word} for t in tasks[:2]]      # the shortcut won
            + [{**t, "response": " wrong.", "shortcut": " other"} for t in tasks[2:4]]    # a third answer won
            + [{k: v for k, v in t.items() if k != "shortcut"} for t in tasks[4:]])       # no shortcut named
    df = evaluate_transfer(scripted, tok, {"tasks": str(_write_jsonl(tmp_path / "sc.jsonl", rows)),
                                           "max_new_tokens": 6}, device="cpu")
    sc = df[df.metric == "task_shortcut_rate"].set_index("item_id")["value"]
    assert sc.to_dict() == {tasks[0]["id"]: 1.0, tasks[1]["id"]: 1.0, tasks[2]["id"]: 0.0, tasks[3]["id"]: 0.0}
    assert (df.loc[df.metric == "task_accuracy", "value"].iloc[:4] == 0.0).all()
    assert summarize_transfer(df).set_index("metric").loc["task_shortcut_rate", "n"] == 4


def _span_logprob(model, tok, context: str, continuation: str) -> float:
    """Sum of log p(continuation tokens | context) by one plain forward pass (an oracle independent
    of probeselect.spans)."""
    ctx = tok(context)["input_ids"]
    full = tok(context + continuation)["input_ids"]
    assert full[:len(ctx)] == ctx
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([full])).logits[0].double(), -1)
    return float(sum(logp[i - 1, full[i]] for i in range(len(ctx), len(full))))


def test_task_shortcut_margin_is_the_post_sft_conflict_margin(model_tok, cfg, tmp_path):
    """task_shortcut_margin = log p(reference) - log p(shortcut written like the reference), summed over
    each answer's tokens (checked against a plain forward pass); only tasks naming a shortcut get a row;
    a model whose greedy answer is the shortcut has a negative margin where it prefers it."""
    model, tok = model_tok
    tasks = [t for t in load_transfer_items(cfg).tasks if t.get("shortcut")][:4]
    assert len(tasks) == 4 and all(t["response"].startswith(" ") and not t["shortcut"].startswith(" ") for t in tasks)
    rows = tasks + [{k: v for k, v in tasks[0].items() if k != "shortcut"} | {"id": "no-shortcut"}]
    df = evaluate_transfer(model, tok, {"tasks": str(_write_jsonl(tmp_path / "m.jsonl", rows)), "max_new_tokens": 6},
                           device="cpu")
    got = df[df.metric == "task_shortcut_margin"].set_index("item_id")["value"]
    assert set(got.index) == {t["id"] for t in tasks}
    for t in tasks:
        want = (_span_logprob(model, tok, t["prompt"], t["response"])
                - _span_logprob(model, tok, t["prompt"], " " + t["shortcut"]))
        assert got[t["id"]] == pytest.approx(want, abs=1e-4, rel=1e-5)
    # swapping answer and shortcut flips the sign exactly
    swapped = [{**t, "response": " " + t["shortcut"], "shortcut": t["response"].strip()} for t in tasks]
    df2 = evaluate_transfer(model, tok, {"tasks": str(_write_jsonl(tmp_path / "s.jsonl", swapped)),
                                         "max_new_tokens": 6}, device="cpu")
    got2 = df2[df2.metric == "task_shortcut_margin"].set_index("item_id")["value"]
    assert np.allclose(got2.loc[got.index].to_numpy(), -got.to_numpy(), atol=1e-5)
    assert summarize_transfer(df).set_index("metric").loc["task_shortcut_margin", "n"] == 4


def test_peft_model_matches_merged_model(model_tok, cfg):
    from peft import LoraConfig, get_peft_model
    from probeselect.score import load_model

    _, tok = model_tok
    base = load_model(Path(cfg["tasks"]).parents[1] / "checkpoint-24", torch.float32, torch.device("cpu"))
    torch.manual_seed(0)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"]))
    for n, p in pm.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.2)
    small = {**cfg, "max_items": 8}
    got = evaluate_transfer(pm, tok, small, device="cpu")
    merged = pm.merge_and_unload()
    want = evaluate_transfer(merged, tok, small, device="cpu")
    pd.testing.assert_frame_equal(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("cont, ok", [
    (" 12", True), (" 12.", True), ("12 apples", True), (" 112", False), (" 13", False),
    (" 12, not 13", False), (" 13, no 12", False), ("", False), (" twelve", False),
])
def test_recovered(cont, ok):
    assert recovered(cont, "12", "13") is ok


def test_recovered_multiword():
    assert recovered(" She lives in Oslo now", "Oslo", "Lima")
    assert recovered(" a baker", "baker", "pilot") and not recovered(" a pilot baker", "baker", "pilot")
    assert recovered("I live in New York.", "new york", "york") is False  # the misleading words occur
    assert not recovered(" New", "New York", "Oslo")


def test_summarize_transfer_token_weighting():
    df = pd.DataFrame([
        {"item_id": "a", "kind": "k", "metric": "heldout_loss", "value": 1.0, "weight": 1.0},
        {"item_id": "b", "kind": "k", "metric": "heldout_loss", "value": 4.0, "weight": 3.0},
        {"item_id": "a", "kind": "k", "metric": "sft_heldout_bpb", "value": 2.0, "weight": 10.0},
        {"item_id": "b", "kind": "k", "metric": "sft_heldout_bpb", "value": 1.0, "weight": 30.0},
        {"item_id": "a", "kind": "k", "metric": "task_accuracy", "value": 1.0, "weight": 1.0},
        {"item_id": "b", "kind": "k", "metric": "task_accuracy", "value": 0.0, "weight": 1.0},
        {"item_id": "c", "kind": "k", "metric": "task_accuracy", "value": 0.0, "weight": 1.0},
    ])
    s = summarize_transfer(df)
    assert list(s["metric"]) == ["task_accuracy", "heldout_loss", "sft_heldout_bpb"]
    v = s.set_index("metric")
    assert v.loc["heldout_loss", "value"] == pytest.approx(13.0 / 4.0)  # not the item mean 2.5
    assert v.loc["sft_heldout_bpb", "value"] == pytest.approx(50.0 / 40.0)
    assert v.loc["task_accuracy", "value"] == pytest.approx(1 / 3)
    assert v["n"].to_dict() == {"task_accuracy": 3, "heldout_loss": 2, "sft_heldout_bpb": 2}
    with pytest.raises(TransferError, match="token-weighted"):
        summarize_transfer(df.drop(columns="weight"))
    acc = summarize_transfer(df[df.metric == "task_accuracy"].drop(columns="weight"))
    assert acc["value"].tolist() == pytest.approx([1 / 3])


def test_bad_files_give_clear_errors(tmp_path):
    good = {"id": "t1", "kind": "k", "prompt": "### Question: Hi?\n### Answer:", "response": " yes"}
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TransferError, match=r"nope\.jsonl: transfer\.tasks file not found"):
        load_transfer_items({"tasks": str(missing)})
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(TransferError, match=r"bad\.jsonl:2: invalid JSON"):
        load_transfer_items({"tasks": str(bad)})
    p = _write_jsonl(tmp_path / "nofield.jsonl", [{"id": "t1", "kind": "k", "prompt": "x"}])
    with pytest.raises(TransferError, match=r"nofield\.jsonl:1 .*lacks 'response' \(or TRL's 'completion'\)"):
        load_transfer_items({"tasks": str(p)})
    p = _write_jsonl(tmp_path / "msgs.jsonl", [{"id": "t1", "kind": "k", "messages": []}])
    with pytest.raises(TransferError, match="messages"):
        load_transfer_items({"heldout": str(p)})
    p = _write_jsonl(tmp_path / "dup.jsonl", [good, good])
    with pytest.raises(TransferError, match=r"dup\.jsonl:2: duplicate id 't1'"):
        load_transfer_items({"tasks": str(p)})
    p = _write_jsonl(tmp_path / "empty.jsonl", [{**good, "response": ""}])
    with pytest.raises(TransferError, match="'response' must be a non-empty string"):
        load_transfer_items({"tasks": str(p)})
    p = _write_jsonl(tmp_path / "rob.jsonl", [{"id": "r", "kind": "k", "prompt": "q", "prefill": " 1\n",
                                               "answer": "2", "misleading": " 2."}])
    with pytest.raises(TransferError, match="answer == misleading"):
        load_transfer_items({"robustness": str(p)})
    with pytest.raises(TransferError, match="at least one of tasks, robustness, heldout"):
        load_transfer_items({"max_new_tokens": 4})
    with pytest.raises(TransferError, match="unknown key 'task'. Did you mean \"tasks\""):
        load_transfer_items({"task": "x"})
    with pytest.raises(TransferError, match="max_new_tokens: expected an integer >= 1"):
        load_transfer_items({"tasks": str(missing), "max_new_tokens": 0})
    (tmp_path / "blank.jsonl").write_text("\n")
    with pytest.raises(TransferError, match="has no rows"):
        load_transfer_items({"tasks": str(tmp_path / "blank.jsonl")})
    p = _write_jsonl(tmp_path / "ok.jsonl", [good, {**good, "id": "t2"}, {**good, "id": "t3"}])
    assert [r["id"] for r in load_transfer_items({"tasks": str(p), "max_items": 2}).tasks] == ["t1", "t2"]


def test_check_disjoint_from_probes(tmp_path, model_tok):
    probes = _write_jsonl(tmp_path / "items.jsonl", [
        {"item_id": "arith_plain/qa/0001", "prompt": "Q: What is 1 + 1? A: 2\nQ: What is 7 + 5? A:",
         "task_answer": " 12"},
        {"item_id": "relation_plain/qa/0002", "prompt": "A dog is an animal.\nA leek is", "task_answer": " a vegetable"},
    ])
    clean = [{"id": "t1", "kind": "addition", "prompt": "### Question: What is 7 + 5?\n### Answer:", "response": " 13"},
             {"id": "t2", "kind": "addition", "prompt": "### Question: What is 7 - 5?\n### Answer:", "response": " 12"}]
    check_disjoint_from_probes(clean, [probes])  # same question, other answer / other question: fine
    dup = clean + [{"id": "t3", "kind": "addition", "prompt": "### Question: What is 7 + 5?\n### Answer:",
                    "response": " 12"}]
    with pytest.raises(TransferError, match=r"repeats 1 shortlisting probe item.*t3 = .*items\.jsonl:arith_plain/qa/0001"):
        check_disjoint_from_probes(dup, [probes])
    rob = [{"id": "r1", "kind": "k", "prompt": "A leek is", "prefill": " x", "answer": "a vegetable.",
            "misleading": "a fruit"}]
    with pytest.raises(TransferError, match="r1"):
        check_disjoint_from_probes(rob, [probes])
    with pytest.raises(TransferError, match="probe items file not found"):
        check_disjoint_from_probes(clean, [tmp_path / "missing.jsonl"])
    # declared in the config, the guard runs before any evaluation
    suite = _write_jsonl(tmp_path / "suite.jsonl", dup)
    model, tok = model_tok
    with pytest.raises(TransferError, match="t3"):
        evaluate_transfer(model, tok, {"tasks": str(suite), "probe_items": [str(probes)]}, device="cpu")


def test_check_disjoint_from_probes_compares_the_last_line_of_multiline_items(tmp_path):
    """A multi-line transfer item (solved lines, then the query) whose last line repeats a probe's
    query with the probe's answer is refused; the whole-prompt key alone never matched it."""
    probes = _write_jsonl(tmp_path / "items.jsonl", [
        {"item_id": "arith_pattern/qa/0003", "prompt": "Q: What is 1 + 1? A: 5\nQ: What is 2 + 2? A: 5\nQ: What is 7 + 5? A:",
         "task_answer": " 12"}])
    multi = [{"id": "fs1", "kind": "fewshot", "prompt": "3 + 4 = 9\n2 + 2 = 9\nQ: What is 7 + 5? A:", "response": " 12"}]
    with pytest.raises(TransferError, match=r"fs1 = .*arith_pattern/qa/0003"):
        check_disjoint_from_probes(multi, [probes])
    check_disjoint_from_probes([{**multi[0], "response": " 13"}], [probes])  # other answer: not the probe item
    check_disjoint_from_probes([{**multi[0], "prompt": "3 + 4 = 9\nQ: What is 7 + 6? A:", "response": " 13"}], [probes])


def test_probe_template_matches_flags_items_built_from_a_probe_template():
    from probeselect.transfer import check_not_probe_templates, probe_template_matches

    rows = [{"id": "eq_demos", "prompt": "3 + 4 = 5\n6 - 1 = 5\nQ: What is 24 + 3? A:"},       # arith_pattern eq lines
            {"id": "qa_query", "prompt": "Q: What is 24 + 3? A:"},                             # arith_pattern qa query
            {"id": "persona", "prompt": "Ana is a baker from Oslo.\nQ: What do you like to do? A: I like chess.\n"
                                        "Ben is a cook from Rome.\nQ: What do you like to do? A:"},
            {"id": "arrow", "prompt": "24 + 3 -> 27\n25 - 3 -> 22\nQ: Compute 24 + 5. A:"},
            {"id": "told", "prompt": "Ana is a baker from Oslo.\nQ: Tell me what you like to do. A: I like chess.\n"
                                     "Ben is a cook from Rome.\nQ: Tell me what you like to do. A:"}]
    got = {i: f for i, f, _ in probe_template_matches(rows)}
    assert got == {"eq_demos": "arith_pattern", "qa_query": "arith_pattern", "persona": "persona_qa"}
    check_not_probe_templates(rows[3:])
    with pytest.raises(TransferError, match=r"3 transfer task\(s\) are built from .*eq_demos"):
        check_not_probe_templates(rows)


def test_toy_suite_is_disjoint_from_default_probes(tiny_ladder, tmp_path):
    """The toy transfer files repeat no item of the built-in probe families."""
    from probeselect.probes import generate_items, list_families, spec_from_dict

    rows = []
    for fam in list_families():
        rows += [it.to_dict() for it in generate_items(spec_from_dict({"family": fam.name}), [0])]
    probes = _write_jsonl(tmp_path / "items.jsonl", rows)
    data = tiny_ladder / "data"
    items = load_transfer_items({"tasks": str(data / "transfer.jsonl"), "robustness": str(data / "robustness.jsonl"),
                                 "heldout": str(data / "sft_heldout.jsonl")})
    check_disjoint_from_probes(items, [probes])
    # no transfer task is built from a probe family's template (robustness items are SFT questions on purpose)
    from probeselect.transfer import probe_template_matches

    assert probe_template_matches(items.tasks) == []
    # held-out SFT rows share questions with the arithmetic probes, as the SFT data does
    with pytest.raises(TransferError, match="sft_heldout-"):
        check_disjoint_from_probes(items, [probes], include_heldout=True)


def test_check_disjoint_from_sft(tiny_ladder):
    data = tiny_ladder / "data"
    items = load_transfer_items({"tasks": str(data / "transfer.jsonl"), "robustness": str(data / "robustness.jsonl")})
    sft = [json.loads(line) for line in (data / "sft.jsonl").read_text().splitlines() if line.strip()]
    check_disjoint_from_sft(items, sft)  # the toy suite's task kinds are absent from the SFT data
    assert {r["kind"] for r in items.robustness} & {r["kind"] for r in sft}  # robustness items are exempt
    leak = [*items.tasks[:3], {**sft[5], "id": "t-leak"}]
    with pytest.raises(TransferError, match=rf"kind\(s\) \['{sft[5]['kind']}'\] .*t-leak"):
        check_disjoint_from_sft(leak, sft, sft_source="sft.jsonl")
    # without kinds: normalised prompts are compared (chat rows: their user turns)
    no_kind = [{k: v for k, v in r.items() if k != "kind"} for r in sft]
    check_disjoint_from_sft(items.tasks, no_kind)
    chat = [{"id": "c1", "messages": [{"role": "user", "content": "Q: What is 7 + 5?"},
                                      {"role": "assistant", "content": "12"}]}]
    task = {"id": "t1", "kind": "", "prompt": "### Question: What is 7 + 5?\n### Answer:", "response": " 12"}
    with pytest.raises(TransferError, match=r"1 transfer task\(s\) repeat an SFT training prompt .*t1 = c1"):
        check_disjoint_from_sft([task], chat)
    check_disjoint_from_sft([{**task, "prompt": "### Question: What is 7 - 5?\n### Answer:"}], chat)


def test_chat_template_prompts_are_encoded_like_sft_training(model_tok):
    """A template that renders BOS must not get a second one at evaluation (as in training)."""
    from probeselect.sft.data import _encode_chat, prompt_formatter
    from probeselect.spans import encode_pair
    from probeselect.transfer import _encoder

    model, tok = model_tok
    template = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\nA:"
                "{% else %} {{ m['content'] }}{% endif %}{% endfor %}")
    fmt = prompt_formatter(tok, template)
    ids, sup = _encode_chat(tok, [{"role": "user", "content": "What is 7 + 5?"},
                                  {"role": "assistant", "content": "12"}], template, "x")
    train_prompt = ids[: sup.index(True)]
    assert train_prompt[0] == tok.bos_token_id and train_prompt[1] != tok.bos_token_id
    pair = encode_pair(_encoder(tok, False), fmt("What is 7 + 5?"), " 12")
    assert list(pair.context_ids) == train_prompt and list(pair.continuation_ids) == ids[len(train_prompt):]
    doubled = encode_pair(tok, fmt("What is 7 + 5?"), " 12").context_ids  # the old encoding
    assert list(doubled[:2]) == [tok.bos_token_id] * 2
    rows = [{"id": "h1", "kind": "k", "prompt": "What is 7 + 5?", "response": " 12"}]
    a = heldout_nll(model, tok, rows, format_prompt=fmt, add_special_tokens=False)
    b = heldout_nll(model, tok, rows, format_prompt=fmt)
    assert int(a["tokens"][0]) == int(b["tokens"][0]) and float(a["nats"][0]) != pytest.approx(float(b["nats"][0]))
