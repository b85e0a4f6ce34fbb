"""Content-free calibration (`score --calibrate`, probeselect.probes._calibration): the chance
reference of conflict margins, so a model that ignores the query does not look shortcut-resistant."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pandas as pd
import pytest
import torch

from probeselect.probes import generate_items, get_family, spec_from_dict
from probeselect.probes._calibration import CALIBRATED, calibrated_margins, calibration_specs, cf_name

SMALL = {"real_truthy": dict(n_items=2, n_demos=2), "real_flipped": dict(n_items=4, n_demos=2),
         "real_successive": dict(n_items=2, n_demos=3), "real_repetitive": dict(n_items=3, n_demos=2),
         "real_intuitive": dict(n_items=4), "arith_pattern": dict(n_items=3, n_demos=3)}


@pytest.mark.parametrize("family", CALIBRATED)
def test_content_free_items_differ_only_in_the_query_content(family):
    spec = spec_from_dict({"family": family, **SMALL[family]})
    [cf] = calibration_specs([spec])
    assert cf.family == cf_name(family) and get_family(cf.family).kind == "calibration"
    base, ref = generate_items(spec, [0, 1]), generate_items(cf, [0, 1])
    assert len(base) == len(ref)
    for a, b in zip(base, ref):
        assert (b.family, b.item_id) == (cf.family, cf.family + a.item_id[len(family):])
        assert (a.variant, a.seed, a.candidates, a.task_answer, a.shortcut_answer) == \
               (b.variant, b.seed, b.candidates, b.task_answer, b.shortcut_answer)
        assert b.metadata["calibrates"] == a.item_id and "N/A" in b.prompt and "N/A" not in a.prompt
        # demonstrations and answer cue are the same: the prompts differ only in a short stretch (the query's
        # content in one, "N/A" in the other; letter counting names the letter and the word)
        pre = len(os.path.commonprefix([a.prompt, b.prompt]))
        suf = len(os.path.commonprefix([a.prompt[pre:][::-1], b.prompt[pre:][::-1]]))
        middle = b.prompt[pre:len(b.prompt) - suf]
        assert "N/A" in middle and len(middle) <= len("N/A") * 2 + 40, middle
        assert suf >= 2  # the same answer cue ends both
    assert generate_items(spec, [0, 1]) == base  # generating the reference leaves the family's items alone


def test_only_families_with_a_content_slot_get_a_reference():
    specs = [spec_from_dict({"family": f}) for f in ("real_persona", "arith_plain", "real_truthy")]
    assert [s.family for s in calibration_specs(specs)] == ["real_truthy_cf"]
    given = specs + [dataclasses.replace(specs[-1], family="real_truthy_cf")]
    assert calibration_specs(given) == []  # an explicit _cf spec is not doubled


def test_calibrated_margins_table():
    rows = []
    for ck, step, raw, ref in (("a", 1, [-4.11, 4.20], [-4.15, 4.15]), ("b", 2, [1.0, 0.5], [0.2, -0.3])):
        for v, r, c in zip(("common_misconception.qa", "surprising_truth.qa"), raw, ref):
            rows.append(dict(checkpoint=ck, step=step, family="real_truthy", variant=v, kind="conflict", mean_margin=r,
                             accuracy=float(r > 0)))
            rows.append(dict(checkpoint=ck, step=step, family="real_truthy_cf", variant=v, kind="calibration",
                             mean_margin=c, accuracy=float(c > 0)))
    cal = calibrated_margins(pd.DataFrame(rows)).set_index(["checkpoint", "variant"])
    assert cal.loc[("a", "common_misconception.qa"), "calibrated_mean_margin"] == pytest.approx(0.04)
    assert cal.loc[("a", "surprising_truth.qa"), "calibrated_mean_margin"] == pytest.approx(0.05)
    assert cal.loc[("b", "surprising_truth.qa"), "cf_accuracy"] == 0.0
    assert calibrated_margins(pd.DataFrame([r for r in rows if r["kind"] == "conflict"])).empty


@pytest.fixture(scope="module")
def blind_and_reading(ladder_checkpoints, tmp_path_factory):
    """Two random Llama checkpoints with the toy tokenizer: step1 reads its context, step2 has
    every attention and MLP output zeroed, so its next-token distribution depends on the
    current token only: it cannot read the query."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from probeselect.score import load_tokenizer

    tok = load_tokenizer(ladder_checkpoints[-1])
    root = tmp_path_factory.mktemp("calib")
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("llama", vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                               pad_token_id=tok.pad_token_id, initializer_range=0.3)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(root / "step1")
    tok.save_pretrained(root / "step1")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    model.save_pretrained(root / "step2")
    tok.save_pretrained(root / "step2")
    return root


def test_a_query_blind_model_calibrates_to_zero(blind_and_reading, tmp_path):
    """The model that cannot read the query has raw margins far from 0 but calibrated margins
    of exactly 0 (same answer cue, same candidates); the model that reads it does not."""
    from probeselect._probe_sections import calibration_section
    from probeselect.score import score_checkpoints

    specs = [spec_from_dict({"family": f, **SMALL[f]}) for f in ("real_truthy", "real_successive")]
    res = score_checkpoints(blind_and_reading, specs, seeds=[0], out=tmp_path / "run", progress=False, audit_items=1,
                            calibrate=True)
    s = res.summary
    assert set(s.loc[s["family"].str.endswith("_cf"), "kind"]) == {"calibration"}
    base = s[s["family"].isin(["real_truthy", "real_successive"])].set_index(["checkpoint", "family", "variant"])
    blind, reading = base.xs("step2", level=0), base.xs("step1", level=0)
    assert blind["mean_margin"].abs().max() > 0.05
    # the symptom: real_truthy's two tasks swap task and shortcut labels, so a model with a label prior
    # and no reading gets mirrored raw margins (their variant-rank mean cannot rank); calibrated, both are 0
    t = blind.xs("real_truthy", level=0)["mean_margin"]
    assert t["common_misconception.qa"] == pytest.approx(-t["surprising_truth.qa"], abs=1e-4) and abs(t.iloc[0]) > 0.05
    np.testing.assert_allclose(blind["calibrated_mean_margin"], 0.0, atol=1e-4)
    np.testing.assert_allclose(blind["cf_mean_margin"], blind["mean_margin"], atol=1e-4)
    assert reading["calibrated_mean_margin"].abs().max() > 1e-3
    assert s.loc[s["kind"] == "calibration", "calibrated_mean_margin"].isna().all()
    # the audit leaves the references out; the report shows raw and calibrated side by side
    audit = pd.read_parquet(tmp_path / "run" / "audit.parquet")
    assert not audit["family"].str.endswith("_cf").any()
    sec = calibration_section(tmp_path / "run")
    assert sec is not None and sec.title == "Margins against a content-free reference"
    assert sec.blocks[1].header[2:5] == ["raw margin", "content-free reference", "calibrated margin"]
    assert len(sec.blocks[1].rows) == 4 and len(sec.blocks[3].rows) == len(base)
    # without --calibrate nothing changes: no reference rows, no new columns, no report section
    plain = score_checkpoints(blind_and_reading, specs[:1], seeds=[0], out=tmp_path / "plain", progress=False,
                              audit_items=0)
    assert "calibrated_mean_margin" not in plain.summary.columns
    assert not plain.summary["family"].str.endswith("_cf").any() and calibration_section(tmp_path / "plain") is None


def test_run_config_takes_calibrate(tmp_path):
    from probeselect.run import RunConfigError, load_run_config

    p = tmp_path / "c.yaml"
    base = "out: x\nladder: y\nplan: p.yaml\npilot: {recipe: r.yaml}\nscore: {probes: [a.yaml], calibrate: %s}\n"
    p.write_text(base % "true")
    assert load_run_config(p)["score"]["calibrate"] is True
    p.write_text(base % "'yes'")
    with pytest.raises(RunConfigError, match="score.calibrate must be true"):
        load_run_config(p)
