"""SFT data loading, masking and the pre-training data checks."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from probeselect.errors import SFTDataError
from probeselect.score import load_tokenizer
from probeselect.sft.data import IGNORE, collate, encode_rows, load_rows


@pytest.fixture(scope="module")
def tok(ladder_checkpoints):
    return load_tokenizer(ladder_checkpoints[-1])


def test_toy_rows_supervise_response_and_eos_only(tiny_ladder, tok):
    rows = load_rows(tiny_ladder / "data" / "sft.jsonl")
    row = rows[0]
    (ex,) = encode_rows([row], tok, max_length=64)
    p_ids = tok(row["prompt"]).input_ids
    r_ids = tok(row["prompt"] + row["response"]).input_ids[len(p_ids):]
    assert list(ex.input_ids) == p_ids + r_ids + [tok.eos_token_id]
    assert list(ex.labels) == [IGNORE] * len(p_ids) + r_ids + [tok.eos_token_id]
    assert ex.n_sup == len(r_ids) + 1 and ex.id == row["id"]
    (ex_all,) = encode_rows([row], tok, max_length=64, loss_on="all")
    assert ex_all.n_sup == len(ex.input_ids) - 1  # every token but the first is a target


def test_zero_supervised_and_lost_eos_name_the_example(tok):
    long_prompt = {"id": "ex-long-prompt", "prompt": "### Question: " + "one two three " * 40, "response": " 4"}
    with pytest.raises(SFTDataError, match=r"example ex-long-prompt has zero supervised tokens within max_length 16"):
        encode_rows([long_prompt], tok, max_length=16, source="sft.jsonl")
    row = {"id": "ex-cut-eos", "prompt": "### Question: What is 2 + 2?\n### Answer:", "response": " 4"}
    n = len(encode_rows([row], tok, max_length=64)[0].input_ids)
    with pytest.raises(SFTDataError, match=rf"example ex-cut-eos is {n} tokens; .*cut off its EOS.*>= {n}"):
        encode_rows([row], tok, max_length=n - 1)
    assert encode_rows([row], tok, max_length=n)[0].input_ids[-1] == tok.eos_token_id
    with pytest.raises(SFTDataError, match="example ex-empty has zero supervised response tokens"):
        encode_rows([{"id": "ex-empty", "prompt": "Q:", "response": ""}], tok, max_length=64)


def test_jsonl_parquet_and_datasets_folder_agree(tmp_path, tok):
    rows = [{"id": f"r{i}", "prompt": f"### Question: What is {i} + 1?\n### Answer:", "response": f" {i + 1}"}
            for i in range(5)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pd.DataFrame(rows).to_parquet(tmp_path / "d.parquet")
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    loaded = [load_rows(tmp_path / n) for n in ("d.jsonl", "d.parquet", "ds")]
    assert loaded[0] == loaded[1] == loaded[2] == rows
    (tmp_path / "noid.jsonl").write_text(json.dumps({"prompt": "a", "response": " b"}) + "\n")
    assert load_rows(tmp_path / "noid.jsonl")[0]["id"] == "noid:0"


@pytest.mark.parametrize("content, match", [
    ('{"id": "a", "prompt": "x", "response": " y"}\n{bad\n', r"bad.jsonl: line 2: invalid JSON"),
    ('{"id": "a", "prompt": "x", "response": " y"}\n{"id": "a", "prompt": "x", "response": " y"}\n',
     r"duplicate id 'a'"),
    ('{"id": "a", "text": "x"}\n', r"bad.jsonl: line 1 \(id 'a'\): unrecognised row .*language-modeling .*\"completion\""),
])
def test_bad_data_files(tmp_path, content, match):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(SFTDataError, match=match):
        load_rows(f)
    with pytest.raises(SFTDataError, match="SFT data not found"):
        load_rows(tmp_path / "missing.jsonl")


TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


def test_chat_messages_supervise_assistant_turns(tok):
    msgs = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": " 4"},
            {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": " 6"}]
    (ex,) = encode_rows([{"id": "chat-1", "messages": msgs}], tok, max_length=128, chat_template=TEMPLATE)
    sup_text = tok.decode([t for t in ex.labels if t != IGNORE])
    assert "4" in sup_text and "6" in sup_text and "What" not in sup_text and "user" not in sup_text
    assert ex.labels[-1] == tok.eos_token_id
    with pytest.raises(SFTDataError, match="example chat-2: chat messages need a chat template"):
        encode_rows([{"id": "chat-2", "messages": msgs}], tok, max_length=128)


def test_collate_right_pads(tok, tiny_ladder):
    ex = encode_rows(load_rows(tiny_ladder / "data" / "sft.jsonl")[:3], tok, max_length=64)
    b = collate(ex, pad_id=tok.pad_token_id)
    n = max(len(e.input_ids) for e in ex)
    assert b["input_ids"].shape == (3, n)
    assert int(b["attention_mask"].sum()) == sum(len(e.input_ids) for e in ex)
    assert int((b["labels"] != IGNORE).sum()) == sum(e.n_sup for e in ex)
