"""bench/presft_copy.py: the pretrained bases' margin between a transfer row's answer and its shortcut."""
import pandas as pd
import pytest
import torch

from _bench import load_bench


@pytest.fixture(scope="module")
def pc():
    return load_bench("presft_copy")


def _direct_margin(ck, prompt, answer, shortcut):
    """log p(answer) - log p(shortcut) after ``prompt``, token by token with a plain forward pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(ck), AutoModelForCausalLM.from_pretrained(ck).eval()

    def lp(cont):
        ctx, whole = tok.encode(prompt), tok.encode(prompt + cont)
        with torch.no_grad():
            out = torch.log_softmax(model(torch.tensor([whole])).logits[0].float(), -1)
        return sum(out[i - 1, whole[i]].item() for i in range(len(ctx), len(whole)))

    return lp(answer) - lp(" " + shortcut)


def test_margins_and_the_shortcut_share_match_a_direct_forward_pass(pc, tiny_ladder, ladder_checkpoints, tmp_path):
    ck = ladder_checkpoints[-1]
    step = int(ck.name.split("-")[1])
    rows = pc.read_rows(tiny_ladder, "persona_tell_copy")
    got = pc.margins(ck, rows[:4])
    want = [_direct_margin(ck, r["prompt"], r["response"], r["shortcut"]) for r in rows[:4]]
    assert got == pytest.approx(want, abs=1e-4)
    assert pc.main([str(tiny_ladder), "--steps", str(step), "--out", str(tmp_path / "t.csv")]) == 0
    t = pd.read_csv(tmp_path / "t.csv")
    every = pc.margins(ck, rows)
    assert t.n[0] == len(rows) and t.mean_margin[0] == pytest.approx(sum(every) / len(every), abs=1e-9)
    assert t.shortcut_preferred[0] == pytest.approx(sum(m < 0 for m in every) / len(every))


def test_bad_input_names_the_file_and_the_fix(pc, tiny_ladder, tmp_path):
    with pytest.raises(SystemExit, match="no transfer set"):
        pc.read_rows(tmp_path, "persona_tell_copy")
    with pytest.raises(SystemExit, match="no row of kind 'nope'"):
        pc.read_rows(tiny_ladder, "nope")
    bad = tmp_path / "bad" / "data"
    bad.mkdir(parents=True)
    (bad / "transfer.jsonl").write_text('{"kind": "persona_tell_copy"}\n{oops\n')
    with pytest.raises(SystemExit, match=r"transfer.jsonl:2: not a JSON line"):
        pc.read_rows(bad.parent, "persona_tell_copy")
    with pytest.raises(SystemExit, match="no such checkpoint"):
        pc.main([str(tiny_ladder), "--steps", "99999"])
