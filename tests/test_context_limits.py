"""Context limits everywhere: span scoring, the generative audit, sampling and run configs
respect --max-length / --on-overflow; nothing crashes; the manifest and report count cuts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from probeselect.score import load_model, load_tokenizer
from probeselect.errors import ScoringError
from probeselect.generation import (ContextOverflowError, greedy_generations, persona_generation_table,
                                    sample_generations)
from probeselect.probes import generate_items, spec_from_dict

REPO = Path(__file__).resolve().parents[1]
MAX_NEW = 16  # score's audit_max_new_tokens default


@pytest.fixture(scope="module")
def small_ctx(ladder_checkpoints, tmp_path_factory):
    """A copy of a toy checkpoint (Llama, rotary) whose config declares P positions: every
    scored span fits in P, but some audit prompts + 16 generated tokens do not."""
    spec = spec_from_dict({"family": "arith_pattern", "n_items": 6, "n_demos": 4})
    tok = load_tokenizer(ladder_checkpoints[-1])
    items = generate_items(spec, [0])
    span_need = max(len(tok.encode(it.prompt)) + max(len(tok.encode(c, add_special_tokens=False))
                                                       for c in it.candidates) - 1 for it in items)
    gen_need = [len(tok.encode(it.prompt)) + MAX_NEW for it in items]
    P = span_need
    assert sum(n > P for n in gen_need) >= 1, "the fixture needs audit prompts that overflow"
    dest = tmp_path_factory.mktemp("ctx") / "ladder" / "step000024"
    shutil.copytree(ladder_checkpoints[-1], dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["max_position_embeddings"] = P
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest, spec, P, sum(n > P for n in gen_need)


def test_score_truncate_cuts_audit_prompts_and_reports_the_count(small_ctx, tmp_path):
    from probeselect.report import write_report
    from probeselect.score import score_checkpoints

    ckpt, spec, P, n_over = small_ctx
    res = score_checkpoints(ckpt, [spec], seeds=[0], out=tmp_path / "run", audit_items=50, on_overflow="truncate",
                            progress=False)
    audit = pd.read_parquet(tmp_path / "run" / "audit.parquet")
    assert int((audit["truncated_tokens"] > 0).sum()) == n_over
    assert res.manifest["truncated_generation_rows"]["audit"] == n_over
    assert res.manifest["generation_rows"]["audit"] == len(audit)
    man = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert man["truncated_generation_rows"]["audit"] == n_over and man["status"] == "complete"
    write_report(tmp_path / "run")
    md = (tmp_path / "run" / "report.md").read_text()
    assert f"{n_over} of {len(audit)} audit" in md
    assert "0 of" in md and "scored" in md  # the spans fit: 0 cut, stated


def test_score_error_mode_names_the_audit_and_the_fix(small_ctx, tmp_path):
    from probeselect.score import score_checkpoints

    ckpt, spec, P, n_over = small_ctx
    with pytest.raises(ScoringError, match=rf"generative audit: {n_over} of \d+ prompts do not fit the {P}-token"
                                           r".*--on-overflow truncate.*--audit-items 0"):
        score_checkpoints(ckpt, [spec], seeds=[0], out=tmp_path / "run", audit_items=50, progress=False)


def test_truncated_generation_equals_hf_generate_on_the_cut_prompt(ladder_checkpoints):
    """Truncation keeps the last (limit - max_new_tokens) prompt tokens, as lm-eval's
    generate_until does; greedy output then equals HF generate on exactly those tokens."""
    path = ladder_checkpoints[-1]
    model, tok = load_model(path, torch.float32, torch.device("cpu")), load_tokenizer(path)
    prompts = ["The opposite of hot is cold. The opposite of up is down. The opposite of big is",
               "Bo is a pilot from Lima. He has an owl. Q: What pet does Bo have? A:"]
    limit, new = 20, 6
    gens = greedy_generations(model, tok, prompts, max_new_tokens=new, max_length=limit, on_overflow="truncate")
    for p, g in zip(prompts, gens):
        ids = tok.encode(p)
        assert len(ids) > limit - new  # really cut
        assert g.truncated_tokens == len(ids) - (limit - new)
        cut = torch.tensor([ids[-(limit - new):]])
        out = model.generate(cut, attention_mask=torch.ones_like(cut), max_new_tokens=new, do_sample=False,
                             pad_token_id=tok.pad_token_id)
        ref = tok.decode(out[0, cut.shape[1]:], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        ref = ref.split(tok.eos_token)[0].split("\n")[0]
        assert g.text == ref
    # sampled generation (the consistency track) cuts the same way and records it per item
    its = generate_items(spec_from_dict({"family": "arith_pattern", "n_items": 2, "n_demos": 4}), [0])
    table = persona_generation_table(model, tok, its, n=3, max_new_tokens=new, max_length=limit,
                                     on_overflow="truncate")
    assert list(table["truncated_tokens"]) == [len(tok.encode(it.prompt)) - (limit - new) for it in its]
    with pytest.raises(ContextOverflowError, match=r"prompt 0 has \d+ tokens.*20-token context \(2 of 2"):
        greedy_generations(model, tok, prompts, max_new_tokens=new, max_length=limit)
    with pytest.raises(ContextOverflowError, match="leaves no room"):
        sample_generations(model, tok, prompts, n=2, max_new_tokens=limit, max_length=limit, on_overflow="truncate")


def test_run_config_accepts_and_passes_context_settings(tmp_path, monkeypatch, tiny_ladder):
    import probeselect.score as score_mod
    from probeselect.run import RunConfigError, load_run_config, run_pipeline

    base = {"out": str(tmp_path / "out"), "ladder": str(tiny_ladder), "plan": "p.yaml", "pilot": {"recipe": "r.yaml"},
            "score": {"probes": [str(REPO / "probes/arith_pattern.yaml")], "seeds": [0], "n_items": 2,
                      "audit_items": 0, "on_overflow": "truncate", "max_length": 64}}
    p = tmp_path / "run.yaml"
    p.write_text(json.dumps(base))
    cfg = load_run_config(p)
    assert cfg["score"]["on_overflow"] == "truncate" and cfg["score"]["max_length"] == 64
    for bad, msg in ((("on_overflow", "cut"), "score.on_overflow must be"), (("max_length", 1), "score.max_length")):
        q = tmp_path / "bad.yaml"
        q.write_text(json.dumps({**base, "score": {**base["score"], bad[0]: bad[1]}}))
        with pytest.raises(RunConfigError, match=msg):
            load_run_config(q)

    seen = {}

    class Stop(Exception):
        pass

    def fake(*a, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(score_mod, "score_checkpoints", fake)
    with pytest.raises(Stop):
        run_pipeline(p, progress=False)
    assert seen["on_overflow"] == "truncate" and seen["max_length"] == 64


def test_score_cli_states_the_cut_counts(small_ctx, tmp_path, capsys):
    from probeselect.cli import main

    ckpt, spec, P, n_over = small_ctx
    spec_file = tmp_path / "arith.yaml"
    spec_file.write_text("family: arith_pattern\nn_items: 6\nn_demos: 4\n")
    assert main(["score", str(ckpt), "--probes", str(spec_file), "--seeds", "0", "--on-overflow", "truncate",
                 "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"{n_over} of " in err and " audit" in err and "Context limit" in err
