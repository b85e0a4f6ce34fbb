"""The shipped real example (recipes/real/, issue 24 item 6) end to end through `probeselect run`, offline, on a
tiny random GPT-NeoX ladder laid out as the Hub revisions of the example's repo in an HF cache; and the
report/run-summary wording for non-toy ladders (the issue's "toy leftovers")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_hub import build_hf_cache

REPO = Path(__file__).resolve().parents[1]
TOY_WORDING = [r"toy world", r"recipes/confirm\.yaml", r"not configured", r"data_lineage", r"\btoy\b"]


def _tiny_neox_ladder(root: Path, tokenizer_from: Path, revisions: list[str]) -> dict[str, Path]:
    """One random GPT-NeoX model per revision (seed = position), saved with the toy tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from probeselect.score import load_tokenizer

    tok = load_tokenizer(tokenizer_from)
    out = {}
    for i, rev in enumerate(revisions):
        torch.manual_seed(i)
        cfg = AutoConfig.for_model("gpt_neox", vocab_size=len(tok), bos_token_id=tok.bos_token_id,
                                   eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   max_position_embeddings=2048, initializer_range=0.3)
        d = root / rev
        AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
        tok.save_pretrained(d)
        out[rev] = d
    return out


@pytest.mark.slow
def test_real_example_runs_offline_on_a_hub_ladder(tmp_path, ladder_checkpoints):
    cfg = yaml.safe_load((REPO / "recipes" / "real" / "run.yaml").read_text())
    repo, revisions = cfg["ladder"]["repo"], cfg["ladder"]["revisions"]
    cache = tmp_path / "hf" / "hub"
    shas = build_hf_cache(cache, repo, _tiny_neox_ladder(tmp_path / "models", ladder_checkpoints[-1], revisions))
    out = tmp_path / "out"
    small = "[budget.optimizer_steps=2, eval.every=0, transfer.max_new_tokens=2]"
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"))
    # the shipped files as they are; only sizes are cut (items, seeds, SFT steps) and the device pinned
    cmd = [sys.executable, "-m", "probeselect", "run", "recipes/real/run.yaml", f"out={out}", "device=cpu",
           "score.seeds=[0]", "score.n_items=2", "score.probes=[real_successive, real_repetitive]",
           f"pilot.overrides={small}", f"confirm.overrides={small}", "--no-progress"]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    summary = res.stdout
    assert f"Hub revisions of {repo} (nothing to build)" in summary and "not configured" not in summary
    assert "averaging needs a local ladder folder" in summary
    report = (out / "score" / "report.md").read_text()
    assert report.startswith(f"# probeselect base selection: {repo}")
    sections = re.split(r"\n(?=## )", report)
    assert len(sections) > 10
    for sec in sections:
        for pat in TOY_WORDING:
            assert not re.search(pat, sec, re.IGNORECASE), (pat, sec[:300])
    for rev in revisions:  # repo, revision and commit of every checkpoint
        assert re.search(rf"\| {rev} \| {re.escape(repo)} \| {rev} \| {shas[rev]} \|", report), rev
    assert "Recipe `recipes/real/confirm.yaml`" in report  # the example's own confirmation recipe
    pilot = (out / "score" / "pilot")
    assert (pilot / "transfer.csv").is_file() and len(list(pilot.glob("step*/seed*/done.json"))) == 3 * 3


# -- the toy leftovers, each on its own (cheap) -----------------------------------------------------------


def test_caveats_fit_any_ladder_and_name_the_interval_used():
    from probeselect.final_report import SELECTION_CAVEATS

    text = " ".join(SELECTION_CAVEATS)
    assert "toy" not in text.lower() and "Selection on this ladder" in text
    assert "bootstrap" not in text.lower()  # the decision intervals are seed-level paired t (select.py), not a bootstrap
    assert "seed-level paired t intervals" in text


def test_confirm_hint_points_at_this_runs_pilot_recipe(tmp_path):
    import json

    from probeselect.final_report import _confirm_command

    (tmp_path / "pilot").mkdir()
    (tmp_path / "pilot" / "manifest.json").write_text(json.dumps(
        {"recipe_source": "recipes/real/pilot.yaml (with overrides budget.optimizer_steps=2)"}))
    hint = _confirm_command(tmp_path, 2)
    assert "recipes/real/pilot.yaml" in hint and "recipes/confirm.yaml" not in hint and "--top 2" in hint
    assert "recipes/confirm.yaml" not in _confirm_command(tmp_path / "nowhere", "N")


def test_hub_ladder_provenance_shows_repo_revision_commit_and_names_the_report():
    from probeselect._report_blocks import provenance_section, render_markdown, run_name

    ckpts = [{"name": f"step{n}", "repo": "EleutherAI/pythia-160m", "revision": f"step{n}", "commit": c * 40,
              "step": n, "fingerprint": c * 64, "tokenizer_hash": "t" * 64} for n, c in ((1000, "a"), (2000, "b"))]
    man = {"status": "complete", "checkpoints": ckpts, "command": ["probeselect", "run", "recipes/real/run.yaml"]}
    assert run_name(Path("score"), man) == "EleutherAI/pythia-160m"
    md = render_markdown("t", [provenance_section(man, Path("."))], Path("."))
    assert "| checkpoint | repo | revision | commit |" in md
    assert f"| step1000 | EleutherAI/pythia-160m | step1000 | {'a' * 40} |" in md
    assert "Hub ladder: `EleutherAI/pythia-160m`, revisions `step1000`, `step2000`" in md
    folder = {"status": "complete", "checkpoints": [{k: v for k, v in c.items() if k not in ("repo", "revision", "commit")}
                                                    for c in ckpts]}
    assert "| repo |" not in render_markdown("t", [provenance_section(folder, Path("."))], Path("."))


def test_select_summary_never_presents_a_non_winner_as_the_pick():
    from types import SimpleNamespace

    from probeselect.run import _select_summary

    r = SimpleNamespace(verdict="no_clear_winner", recommended=None, top="step100", runner_up="step200",
                        reason="one SFT seed: no interval", p_top_beats_runner_up=None)
    assert _select_summary(r) == "no clear winner (one SFT seed: no interval); best seed mean step100, runner-up step200"
    r = SimpleNamespace(verdict="none_eligible", recommended=None, top=None, runner_up=None, reason=None,
                        p_top_beats_runner_up=None)
    assert _select_summary(r) == "no eligible base (none passes the transfer constraints)"
    r = SimpleNamespace(verdict="clear_winner", recommended="step300", top="step300", runner_up="step100",
                        reason=None, p_top_beats_runner_up=0.991)
    assert _select_summary(r) == "clear winner: step300, P(top beats runner-up) 0.99"
