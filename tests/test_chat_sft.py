"""Chat-format SFT and evaluation as TRL does it (issue 24 item 3): TRL's row forms, the
assistant-turn mask from the template, evaluation with the same template, data files checked
before training."""

from __future__ import annotations

import json

import pytest

from probeselect.errors import SFTDataError, TransferError
from probeselect.score import load_tokenizer
from probeselect.sft.data import IGNORE, encode_rows, normalize_row, render_context, supervised_tokens

# A common template for base models: the assistant turn ends with `{{ eos_token }}\n`.
EOS_NL = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}User: {{ m['content'] }}\n"
          "{% elif m['role'] == 'system' %}{{ m['content'] }}\n{% else %}Assistant: {{ m['content'] }}{{ eos_token }}\n"
          "{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}")
# The same with TRL's {% generation %} markers around the assistant text (newline inside on purpose).
EOS_NL_GEN = EOS_NL.replace("Assistant: {{ m['content'] }}{{ eos_token }}\n",
                            "Assistant:{% generation %} {{ m['content'] }}{{ eos_token }}\n{% endgeneration %}")

CONV = [{"role": "user", "content": "Is the night dark?"}, {"role": "assistant", "content": "dark"}]


@pytest.fixture(scope="module")
def tok(ladder_checkpoints):
    return load_tokenizer(ladder_checkpoints[-1])


def _mask(tok, ex):
    return [(t, s) for t, s in supervised_tokens(tok, ex)]


@pytest.mark.parametrize("template", [EOS_NL, EOS_NL_GEN], ids=["prefix-diff", "generation-tag"])
def test_eos_newline_template_supervises_content_and_one_eos(tok, template):
    """`{{ eos_token }}\\n` ends the turn: ' dark' and one EOS are targets; the newline and a second EOS are not
    (the old encoder supervised ' dark', EOS, '\\n', EOS)."""
    (ex,) = encode_rows([{"id": "x", "messages": CONV}], tok, max_length=64, chat_template=template)
    mask = _mask(tok, ex)
    print("\n" + " ".join(f"{t!r}{'*' if s else ''}" for t, s in mask))
    assert [t for t, s in mask if s] == [" dark", tok.eos_token]
    assert mask[-2:] == [(" dark", True), (tok.eos_token, True)]  # the sequence ends at the supervised EOS
    assert mask[0] == (tok.bos_token, False)
    assert sum(t == tok.eos_token for t, _ in mask) == 1 and "\n" not in [t for t, _ in mask[-3:]]
    assert ex.n_sup == 2
    # the context before the turn is exactly the rendered generation prompt's tokens (what evaluation feeds)
    ctx = tok(render_context(tok, {"id": "x", "messages": CONV, "n_context": 0}, template),
              add_special_tokens=False).input_ids
    assert list(ex.input_ids[: len(ctx)]) == ctx and ex.labels[len(ctx)] != IGNORE and ex.labels[len(ctx) - 1] == IGNORE


def test_multi_turn_keeps_the_newline_as_context(tok):
    msgs = CONV + [{"role": "user", "content": "And the day?"}, {"role": "assistant", "content": "light"}]
    for template in (EOS_NL, EOS_NL_GEN):
        (ex,) = encode_rows([{"id": "m", "messages": msgs}], tok, max_length=96, chat_template=template)
        mask = _mask(tok, ex)
        sup = [t for t, s in mask if s]
        assert sup == [" dark", tok.eos_token, " light", tok.eos_token]
        i = [t for t, _ in mask].index(tok.eos_token)
        assert mask[i + 1] == ("\n", False)  # between turns the newline is context, not a target


def test_trl_row_forms_encode_alike(tok, tmp_path):
    """prompt/response == TRL standard prompt/completion; messages == TRL conversational prompt/completion;
    a few-shot assistant turn inside a conversational prompt is context (TRL's completion_only_loss)."""
    plain = [{"id": "a", "prompt": "Q: What is 2 + 2? A:", "response": " 4"}]
    std = [{"id": "a", "prompt": "Q: What is 2 + 2? A:", "completion": " 4"}]
    msgs = [{"id": "b", "messages": CONV}]
    conv = [{"id": "b", "prompt": CONV[:1], "completion": CONV[1:]}]
    f = tmp_path / "rows.jsonl"
    for a, b, template in ((plain, std, None), (msgs, conv, EOS_NL)):
        f.write_text("".join(json.dumps(r) + "\n" for r in b))
        from probeselect.sft.data import load_rows

        assert (encode_rows(a, tok, max_length=64, chat_template=template)
                == encode_rows(load_rows(f), tok, max_length=64, chat_template=template))
    few_shot = {"id": "c", "prompt": [{"role": "user", "content": "Is snow white?"},
                                      {"role": "assistant", "content": "white"}, CONV[0]], "completion": CONV[1:]}
    (ex,) = encode_rows([normalize_row(few_shot, "row c")], tok, max_length=96, chat_template=EOS_NL)
    assert [t for t, s in _mask(tok, ex) if s] == [" dark", tok.eos_token]
    (ex_all,) = encode_rows([{"id": "b", "messages": [*few_shot["prompt"], CONV[1]]}], tok, max_length=96,
                            chat_template=EOS_NL)
    assert [t for t, s in _mask(tok, ex_all) if s] == [" white", tok.eos_token, " dark", tok.eos_token]


def test_bad_rows_name_file_line_and_fix(tmp_path):
    from probeselect.sft.data import load_rows

    f = tmp_path / "chat.jsonl"
    rows = [{"messages": CONV}, {"id": "r2", "prompt": CONV[:1], "completion": [{"role": "user", "content": "x"}]}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SFTDataError, match=rf"{f}: line 2 \(id 'r2'\): completion has no assistant message"):
        load_rows(f)
    f.write_text(json.dumps({"id": "r1", "messages": [{"role": "user", "content": 3}]}) + "\n")
    with pytest.raises(SFTDataError, match=r"line 1 \(id 'r1'\): message 0 \(user\) has content 3; expected a string"):
        load_rows(f)
    f.write_text(json.dumps({"id": "r1", "messages": CONV[:1]}) + "\n")
    with pytest.raises(SFTDataError, match=r"line 1 \(id 'r1'\): the conversation has no assistant turn"):
        load_rows(f)


def test_generation_prompt_with_trailing_space_is_refused(tok):
    """Evaluation would prompt with a lone ' ' token that training never showed before the answer."""
    template = EOS_NL.replace("Assistant:{% endif %}", "Assistant: {% endif %}")
    with pytest.raises(SFTDataError, match=r"example x: the chat template's generation prompt before turn 1 "
                                           r"tokenizes differently .*trailing whitespace"):
        encode_rows([{"id": "x", "messages": CONV}], tok, max_length=64, chat_template=template)


def test_evaluation_uses_the_template_and_the_sft_mask(ladder_checkpoints, tok, tmp_path):
    """Chat held-out rows are scored on exactly the SFT-supervised tokens; chat tasks are prompted with the
    rendered context + generation prompt (same numbers as the equivalent plain rows without added BOS)."""
    import torch

    from probeselect.score import load_model
    from probeselect.transfer import evaluate_transfer, heldout_nll, load_transfer_items

    model = load_model(ladder_checkpoints[-1], torch.float32, torch.device("cpu"))
    held = [{"id": "h1", "messages": CONV}, {"id": "h2", "prompt": [CONV[0]], "completion": [
        {"role": "assistant", "content": "very dark"}]}]
    tasks = [{"id": "t1", "kind": "color", "prompt": [{"role": "user", "content": "What is 7 + 5?"}],
              "completion": [{"role": "assistant", "content": "12"}], "shortcut": "4"}]

    def write(name, rows):
        p = tmp_path / name
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return str(p)

    cfg = {"heldout": write("held.jsonl", held), "tasks": write("tasks.jsonl", tasks), "max_new_tokens": 3}
    items = load_transfer_items(cfg)
    nll = heldout_nll(model, tok, items.heldout, chat_template=EOS_NL)
    ex = encode_rows(items.heldout, tok, max_length=64, chat_template=EOS_NL)
    assert nll["tokens"].tolist() == [e.n_sup for e in ex] and ex[0].n_sup == 2  # " dark" + EOS
    assert nll["bytes"].tolist() == [len("dark"), len("very dark")]
    with torch.no_grad():  # the summed NLL of the supervised tokens, computed directly
        ids = torch.tensor([ex[0].input_ids])
        lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        want = -sum(float(lp[i - 1, t]) for i, t in enumerate(ex[0].labels) if t != IGNORE)
    assert float(nll["nats"][0]) == pytest.approx(want, rel=1e-4)
    out = evaluate_transfer(model, tok, cfg, chat_template=EOS_NL)
    ctx = render_context(tok, items.tasks[0], EOS_NL)
    assert ctx.endswith("User: What is 7 + 5?\nAssistant:") and ctx.count(tok.bos_token) == 1
    plain = {"tasks": write("plain.jsonl", [{"id": "t1", "kind": "color", "prompt": ctx, "response": " 12",
                                            "shortcut": "4"}]),
             "max_new_tokens": 3}
    ref = evaluate_transfer(model, tok, plain, add_special_tokens=False)
    a = out.set_index("metric")["value"]
    b = ref.set_index("metric")["value"]
    assert a["task_logprob"] != pytest.approx(0) and float(a["task_logprob"]) == pytest.approx(float(b["task_logprob"]))
    # the shortcut is rendered as the template renders an assistant turn (" 4" after "Assistant:"), as the answer
    assert float(a["task_shortcut_margin"]) != pytest.approx(0)
    assert float(a["task_shortcut_margin"]) == pytest.approx(float(b["task_shortcut_margin"]))


def test_every_data_file_is_checked_before_training(tiny_ladder, tok, tmp_path):
    """check_recipe_data (plan lock --recipe without a tokenizer, pilot with one) reads sft, heldout, tasks and
    robustness and names the file, the row and the fix."""
    from _sft_helpers import small_recipe

    from probeselect.sft.check_data import check_recipe_data

    counts = check_recipe_data(small_recipe(tiny_ladder), tok)
    assert set(counts) == {"data.train", "transfer.tasks", "transfer.robustness", "transfer.heldout"}
    held = tmp_path / "held.jsonl"
    held.write_text(json.dumps({"id": "h1", "kind": "k", "prompt": "Q: 1 + 1? A:", "response": " 2"}) + "\n"
                    + json.dumps({"id": "h2", "messages": [CONV[0], {"role": "tool", "content": "x"}]}) + "\n")
    rec = small_recipe(tiny_ladder, transfer={"heldout": str(held)}, eval={"every": 0})
    with pytest.raises(TransferError, match=rf"{held}:2 \(transfer.heldout, id 'h2'\): message 1 has role 'tool'.*"
                                            "Map it to one of them or drop the row"):
        check_recipe_data(rec)  # no tokenizer needed: plan lock finds it
    held.write_text(json.dumps({"id": "h2", "messages": CONV}) + "\n")
    check_recipe_data(rec)
    with pytest.raises(SFTDataError, match=rf"{held}: transfer.heldout row 'h2' is a chat conversation but neither "
                                           "the recipe .*nor the tokenizer has a chat template; set data.chat_template"):
        check_recipe_data(rec, tok)  # the toy tokenizer has no template
    rec = small_recipe(tiny_ladder, transfer={"heldout": str(held)}, eval={"every": 0},
                       data__chat_template=EOS_NL.replace("Assistant:{% endif %}", "Assistant: {% endif %}"))
    with pytest.raises(SFTDataError, match=rf"{held}: example h2: the chat template's generation prompt"):
        check_recipe_data(rec, tok)  # a template whose generation prompt ends in a space
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t1", "prompt": "Is the ni", "completion": "ght dark"}) + "\n")
    rec = small_recipe(tiny_ladder, transfer={"tasks": str(tasks)}, eval={"every": 0})
    with pytest.raises(TransferError, match=rf"{tasks}: transfer.tasks row 't1': .*merges into the prompt"):
        check_recipe_data(rec, tok)


def test_a_pilot_failed_before_training_does_not_block_the_corrected_recipe(tiny_ladder, ladder_checkpoints,
                                                                            tmp_path):
    """A wrong LoRA module name fails after data_manifest-seed*.json was written; the corrected recipe (here
    also a different max_length, so a different data manifest) then runs in the same folder."""
    from _sft_helpers import small_recipe

    from probeselect.pilot import run_pilot

    out = tmp_path / "pilot"
    bad = small_recipe(tiny_ladder, method={"type": "lora", "r": 4, "alpha": 8, "target_modules": ["nope_proj"]},
                       transfer={"tasks": str(tiny_ladder / "data" / "transfer.jsonl"), "max_items": 2,
                                 "max_new_tokens": 2}, eval={"every": 0})
    with pytest.raises(Exception, match="nope_proj"):
        run_pilot([ladder_checkpoints[-1]], bad, out, progress=False, device="cpu", threads=1)
    assert (out / "data_manifest-seed0.json").is_file()
    good = small_recipe(tiny_ladder, data__max_length=96, budget={"optimizer_steps": 2},
                        transfer={"tasks": str(tiny_ladder / "data" / "transfer.jsonl"), "max_items": 2,
                                  "max_new_tokens": 2}, eval={"every": 0})
    res = run_pilot([ladder_checkpoints[-1]], good, out, progress=False, device="cpu", threads=1)
    assert len(res.trained) == 1
    m = json.loads((out / "data_manifest-seed0.json").read_text())
    assert m["n_steps"] == 2
