"""run_pilot / `probeselect pilot`: matched runs, output layout, resumability, refusal and base resolution."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from _sft_helpers import small_recipe
from probeselect.cli import main
from probeselect.errors import ManifestMismatchError, SelectionError
from probeselect.pilot import DIAGNOSTIC_COLUMNS, resolve_bases, run_pilot


@pytest.fixture(scope="module")
def pilot(tiny_ladder, ladder_checkpoints, tmp_path_factory):
    out = tmp_path_factory.mktemp("pilot") / "pilot"
    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 4}, seeds=[0, 1])
    bases = [ladder_checkpoints[-2], ladder_checkpoints[-1]]
    res = run_pilot(bases, recipe, out, progress=False, merged=True, device="cpu")
    return res, recipe, bases, out


def test_layout_tables_and_matching(pilot):
    res, recipe, bases, out = pilot
    names = [b.name for b in bases]
    assert sorted(res.trained) == sorted((n, s) for n in names for s in (0, 1)) and res.reused == []
    # LoRA default: the two seeds of each base trained together (batch_seeds), recorded per base and segment
    assert res.manifest["batch_seeds"]["bases"] == {n: {"seeds": [0, 1], "batched": True} for n in names}
    assert json.loads((out / names[0] / "seed1" / "lineage.json").read_text())["segments"][0]["batched_seeds"] == [0, 1]
    for f in ("manifest.json", "data_manifest-seed0.json", "data_manifest-seed1.json", "transfer.csv",
              "transfer_items.parquet", "diagnostics.csv"):
        assert (out / f).is_file(), f
    for n in names:
        for s in (0, 1):
            d = out / n / f"seed{s}"
            for f in ("train_log.jsonl", "lineage.json", "state/latest.json", "adapter/adapter_model.safetensors",
                      "merged/model.safetensors", "transfer_items.parquet", "done.json"):
                assert (d / f).is_file(), d / f
            # every base under seed s trained on exactly the seed's manifest
            assert json.loads((d / "data_manifest.json").read_text()) == json.loads(
                (out / f"data_manifest-seed{s}.json").read_text())
            assert len((d / "train_log.jsonl").read_text().splitlines()) == 4
    m0, m1 = (json.loads((out / f"data_manifest-seed{s}.json").read_text()) for s in (0, 1))
    man = json.loads((out / "manifest.json").read_text())
    assert m0["steps"][0]["ids"] != m1["steps"][0]["ids"]
    assert m0["tokenizer_hash"] == man["bases"][0]["tokenizer_hash"] == man["tokenizer_hash"]
    assert man["data_manifests"]["0"]["sha256"] == json.loads((out / n / "seed0" / "done.json").read_text())[
        "manifest_sha256"]
    assert man["kind"] == "pilot" and man["status"] == "complete" and man["recipe_sha256"] == recipe.sha256
    assert [b["name"] for b in man["bases"]] == names and man["seeds"] == [0, 1]
    t = pd.read_csv(out / "transfer.csv")
    assert list(t.columns) == ["base", "seed", "metric", "value", "n"]
    assert set(t["metric"]) == {"task_accuracy", "task_logprob", "termination", "robust_recovery", "heldout_loss",
                                "sft_heldout_bpb", "task_shortcut_rate",   # the toy transfer tasks name their shortcut
                                "task_shortcut_margin"}
    assert len(t) == 2 * 2 * 8 and t.groupby(["base", "seed"]).size().eq(8).all()
    items = pd.read_parquet(out / "transfer_items.parquet")
    assert {"base", "seed", "metric", "item_id", "kind", "value"} <= set(items.columns)
    diag = pd.read_csv(out / "diagnostics.csv")
    assert list(diag.columns) == DIAGNOSTIC_COLUMNS and len(diag) == 4
    assert (diag["steps"] == 4).all() and (diag["nonfinite"] == 0).all()
    assert (diag["sup_tokens"].to_numpy() == [m0["total_sup_tokens"], m1["total_sup_tokens"]] * 2).all()


def test_base_transfer_before_sft(pilot):
    """Every base is evaluated before SFT with the same harness: transfer_base.csv (seed "base")."""
    import torch

    from probeselect.score import load_model, load_tokenizer
    from probeselect.transfer import evaluate_transfer, summarize_transfer

    res, recipe, bases, out = pilot
    tb = pd.read_csv(out / "transfer_base.csv")
    assert list(tb.columns) == ["base", "seed", "metric", "value", "n"] and set(tb["seed"]) == {"base"}
    assert sorted(tb["base"].unique()) == sorted(b.name for b in bases)
    t = pd.read_csv(out / "transfer.csv")
    assert set(tb["metric"]) == set(t["metric"])
    pd.testing.assert_frame_equal(res.transfer_base.reset_index(drop=True), tb, check_dtype=False)
    # the same numbers as evaluating the untouched base directly
    b = bases[-1]
    model = load_model(b, torch.float32, torch.device("cpu"))
    direct = summarize_transfer(evaluate_transfer(model, load_tokenizer(b), recipe.transfer, device=torch.device("cpu")))
    got = tb[tb["base"] == b.name].set_index("metric")["value"]
    for r in direct.itertuples():
        assert got[r.metric] == pytest.approx(r.value, abs=1e-9), r.metric
    # and they differ from the trained runs' (SFT moved the model)
    after = t[(t["base"] == b.name) & (t["metric"] == "task_logprob")]["value"]
    assert any(abs(v - got["task_logprob"]) > 1e-6 for v in after)
    done = json.loads((out / b.name / "base" / "done.json").read_text())
    assert done["base"] == b.name and "transfer_sha256" in done


def test_rerun_skips_finished_pairs_and_resumes_unfinished(pilot, tiny_ladder):
    res, recipe, bases, out = pilot
    again = run_pilot(bases, recipe, out, progress=False, device="cpu")
    assert again.trained == [] and len(again.reused) == 4
    pd.testing.assert_frame_equal(again.transfer, res.transfer)
    run = out / bases[0].name / "seed1"
    # trained but not evaluated (killed before done.json): reloaded and re-evaluated, not retrained,
    # and the reload is neither a lineage segment nor a resume
    (run / "done.json").unlink()
    third = run_pilot(bases, recipe, out, progress=False, device="cpu")
    assert third.trained == [] and third.reevaluated == [(bases[0].name, 1)] and len(third.reused) == 3
    assert len(json.loads((run / "lineage.json").read_text())["segments"]) == 1
    assert json.loads((run / "done.json").read_text())["resumes"] == 0
    pd.testing.assert_frame_equal(third.transfer, res.transfer, check_exact=False, atol=1e-6)
    # killed mid-training (latest state at step 2 of 4): resumes from the state
    (run / "done.json").unlink()
    (run / "state" / "latest.json").write_text('{"step": 2, "dir": "step-000002"}')
    fourth = run_pilot(bases, recipe, out, progress=False, device="cpu")
    assert fourth.trained == [(bases[0].name, 1)] and fourth.reevaluated == []
    assert json.loads((run / "done.json").read_text())["resumes"] == 1
    pd.testing.assert_frame_equal(fourth.transfer, res.transfer, check_exact=False, atol=1e-6)


def test_refuses_runs_with_different_manifests(pilot, tmp_path):
    import shutil

    res, recipe, bases, out = pilot
    copy = tmp_path / "pilot"
    shutil.copytree(out, copy)
    f = copy / bases[1].name / "seed0" / "data_manifest.json"
    m = json.loads(f.read_text())
    m["steps"][1]["ids"][2] = "sft-tampered"
    f.write_text(json.dumps(m))
    with pytest.raises(ManifestMismatchError, match=rf"{bases[0].name}/seed0 and {bases[1].name}/seed0.*"
                                                    r"optimizer step 2, example 2: .* vs 'sft-tampered'"):
        run_pilot(bases, recipe, copy, progress=False, device="cpu")
    # a changed recipe does not silently reuse the folder
    other = small_recipe(recipe.train_path.parents[1], budget={"optimizer_steps": 5}, seeds=[0, 1])
    with pytest.raises(ManifestMismatchError, match="written with a different data manifest"):
        run_pilot(bases, other, copy, progress=False, device="cpu")


def test_bases_from_shortlist_csv(ladder_checkpoints, tmp_path):
    names = [c.name for c in ladder_checkpoints]
    csv = tmp_path / "shortlist.csv"
    pd.DataFrame({"checkpoint": names, "selected": [n in names[-2:] for n in names],
                  "shortlist_position": [2.0 if n == names[-1] else 1.0 if n == names[-2] else None
                                         for n in names]}).to_csv(csv, index=False)
    with pytest.raises(SelectionError, match="pass --ladder DIR"):
        resolve_bases(csv)
    ladder = ladder_checkpoints[0].parent
    assert [c.name for c in resolve_bases(csv, ladder=ladder)] == names[-2:]
    (tmp_path / "manifest.json").write_text(json.dumps({"checkpoints": [{"name": c.name, "path": str(c)}
                                                                         for c in ladder_checkpoints]}))
    assert [c.path for c in resolve_bases(tmp_path)] == ladder_checkpoints[-2:]  # a score run folder
    pd.DataFrame({"checkpoint": names, "selected": False}).to_csv(csv, index=False)
    with pytest.raises(SelectionError, match="selects no checkpoint"):
        resolve_bases(csv)


def test_cli_pilot_reuses_finished_runs(pilot, tmp_path, capsys):
    res, recipe, bases, out = pilot
    rf = tmp_path / "r.yaml"
    rf.write_text(yaml.safe_dump(recipe.raw))
    rc = main(["pilot", "--bases", *map(str, bases), "--recipe", str(rf), "--out", str(out), "--no-progress"])
    cap = capsys.readouterr()
    assert rc == 0 and "4 runs (0 trained, 4 already done)" in cap.err and "task_logprob" in cap.out
    rc = main(["pilot", "--bases", str(bases[0]), "--recipe", str(rf), "--out", str(tmp_path / "x"),
               "optimizer.lr=fast"])
    assert rc == 2 and "optimizer.lr: expected a finite number, got 'fast'" in capsys.readouterr().err


def test_transfer_only_change_reevaluates_without_retraining(pilot, tmp_path, monkeypatch):
    import shutil

    from probeselect import pilot as pilot_mod

    res, recipe, bases, out = pilot
    copy = tmp_path / "pilot"
    shutil.copytree(out, copy)
    runs = [copy / b.name / f"seed{s}" for b in bases for s in (0, 1)]
    logs = {r: (r / "train_log.jsonl").read_text() for r in runs}
    lineages = {r: (r / "lineage.json").read_text() for r in runs}
    resumes = {r: json.loads((r / "done.json").read_text())["resumes"] for r in runs}
    adapters = {r: (r / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns for r in runs}
    short = small_recipe(recipe.train_path.parents[1], budget={"optimizer_steps": 4}, seeds=[0, 1],
                         transfer__max_new_tokens=1)
    assert short.train_sha256 == recipe.train_sha256 and short.sha256 != recipe.sha256
    again = run_pilot(bases, short, copy, progress=False, device="cpu")
    assert again.trained == [] and again.reused == [] and len(again.reevaluated) == 4
    for r in runs:
        assert (r / "train_log.jsonl").read_text() == logs[r]  # not retrained
        assert (r / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns == adapters[r]  # adapter kept
        assert (r / "lineage.json").read_text() == lineages[r]  # a reload adds no segment
        done = json.loads((r / "done.json").read_text())
        assert done["recipe_sha256"] == short.sha256 and done["trained_recipe_sha256"] == recipe.sha256
        assert done["resumes"] == resumes[r]
    # transfer outputs rewritten: with one new token no generation can end with EOS after an answer token
    t = again.transfer
    assert (t[t.metric == "termination"]["value"] <= res.transfer[res.transfer.metric == "termination"]["value"]
            .to_numpy()).all()
    held = lambda df: df[df.metric == "heldout_loss"].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(held(t), held(res.transfer), check_exact=False, atol=1e-6)  # same weights
    assert json.loads((copy / "manifest.json").read_text())["transfer_sha256"] != json.loads(
        (out / "manifest.json").read_text())["transfer_sha256"]
    assert run_pilot(bases, short, copy, progress=False, device="cpu").reused.__len__() == 4
    # a training setting (optimizer.lr) is refused before any training, as before
    monkeypatch.setattr(pilot_mod, "train", lambda *a, **k: pytest.fail("trained"))
    faster = small_recipe(recipe.train_path.parents[1], budget={"optimizer_steps": 4}, seeds=[0, 1],
                          optimizer__lr=1e-3)
    with pytest.raises(ManifestMismatchError, match="recipe training hash differs"):
        run_pilot(bases, faster, copy, progress=False, device="cpu")


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_leaking_transfer_suites_are_refused_before_training(tiny_ladder, ladder_checkpoints, tmp_path,
                                                             monkeypatch):
    from probeselect import pilot as pilot_mod
    from probeselect.errors import TransferError

    monkeypatch.setattr(pilot_mod, "train", lambda *a, **k: pytest.fail("trained before the leakage check"))
    d = tiny_ladder / "data"
    tasks = [json.loads(line) for line in (d / "transfer.jsonl").read_text().splitlines() if line.strip()]
    sft = [json.loads(line) for line in (d / "sft.jsonl").read_text().splitlines() if line.strip()]
    bases = ladder_checkpoints[-2:]
    # 1. a transfer task of a kind the SFT data trains on
    mixed = _write_jsonl(tmp_path / "mixed.jsonl", tasks[:5] + [{**sft[0], "id": "t-leak"}])
    r = small_recipe(tiny_ladder, transfer__tasks=str(mixed))
    out = tmp_path / "out1"
    with pytest.raises(TransferError, match=rf"kind\(s\) \['{sft[0]['kind']}'\] also occur in the SFT training data"):
        run_pilot(bases, r, out, progress=False, device="cpu")
    assert not out.exists()
    # 2. a score run folder as --bases: its items.jsonl guards by default (no probe_items declared)
    score = tmp_path / "score"
    score.mkdir()
    pd.DataFrame({"checkpoint": [b.name for b in bases], "selected": True}).to_csv(score / "shortlist.csv",
                                                                                  index=False)
    (score / "manifest.json").write_text(json.dumps({"checkpoints": [{"name": b.name, "path": str(b)}
                                                                     for b in bases]}))
    t = tasks[0]
    _write_jsonl(score / "items.jsonl", [{"item_id": "p-1", "prompt": t["prompt"],
                                          "task_answer": t["response"]}])
    r = small_recipe(tiny_ladder)
    assert r.transfer.get("probe_items") is None
    out = tmp_path / "out2"
    with pytest.raises(TransferError, match=rf"repeats 1 shortlisting probe item.*{t['id']} = .*items.jsonl:p-1"):
        run_pilot(score, r, out, progress=False, device="cpu")
    assert not out.exists()
    with pytest.raises(TransferError, match="repeats 1 shortlisting probe item"):  # the csv itself, too
        run_pilot(score / "shortlist.csv", r, out, progress=False, device="cpu")
    # 3. declared probe_items guard checkpoint-folder bases as well
    r = small_recipe(tiny_ladder, transfer__probe_items=[str(score / "items.jsonl")])
    with pytest.raises(TransferError, match="repeats 1 shortlisting probe item"):
        run_pilot(bases, r, out, progress=False, device="cpu")
    assert not out.exists()


def test_two_fresh_pilots_give_identical_numbers(tiny_ladder, ladder_checkpoints, tmp_path):
    """Fixed thread count, seeds and deterministic algorithms: a rerun into a new folder reproduces
    every transfer number, the adapter weights and the saved training states byte for byte."""
    import random

    import numpy as np
    import torch

    recipe = small_recipe(tiny_ladder, budget={"optimizer_steps": 3}, seeds=[1])
    outs = [tmp_path / "a", tmp_path / "b"]
    before = torch.get_num_threads()
    for k, o in enumerate(outs):
        # as two fresh processes would: different Python and NumPy global RNG states before each run
        random.seed(1000 + k)
        np.random.seed(1000 + k)
        run_pilot([ladder_checkpoints[-1]], recipe, o, progress=False, device="cpu")
    assert torch.get_num_threads() == before  # restored afterwards
    a, b = (pd.read_csv(o / "transfer.csv") for o in outs)
    pd.testing.assert_frame_equal(a, b)
    name = ladder_checkpoints[-1].name
    wa, wb = ((o / name / "seed1" / "adapter" / "adapter_model.safetensors").read_bytes() for o in outs)
    assert wa == wb
    # the saved training states too, RNG streams included (Python's and NumPy's global
    # generators are seeded by the run, not inherited from whatever the process did before)
    states = [sorted((o / name / "seed1" / "state").rglob("*.pt")) for o in outs]
    assert states[0] and [p.relative_to(outs[0]) for p in states[0]] == [p.relative_to(outs[1]) for p in states[1]]
    assert any(p.name.startswith("rng-") for p in states[0])
    for pa, pb in zip(*states):
        assert pa.read_bytes() == pb.read_bytes(), pa.relative_to(outs[0])


def test_preflight_records_how_many_transfer_tasks_are_in_a_probe_form(tiny_ladder, ladder_checkpoints, tmp_path):
    """The pilot's leakage record counts transfer tasks written in a built-in probe family's surface form, and the
    report states the count (0 for the toy suite; the old probe-form items are counted, not refused)."""
    from probeselect.final_report import _leakage_lines
    from probeselect.pilot import _preflight

    d = tiny_ladder / "data"
    tasks = [json.loads(line) for line in (d / "transfer.jsonl").read_text().splitlines() if line.strip()]
    sft = [json.loads(line) for line in (d / "sft.jsonl").read_text().splitlines() if line.strip()]
    bases = ladder_checkpoints[-2:]
    rec, _ = _preflight(small_recipe(tiny_ladder), bases, sft)
    n = rec["transfer_tasks"]  # the small recipe caps the suite
    assert 0 < n <= len(tasks) and rec["probe_template_tasks"] == 0
    assert any(f"0 of {n} transfer tasks" in ln for ln in _leakage_lines(rec))
    kind = tasks[0]["kind"]
    old_style = {**tasks[0], "id": "t-eq", "prompt": "3 + 4 = 5\n6 - 1 = 5\nQ: Compute 24 + 3. A:", "kind": kind}
    mixed = _write_jsonl(tmp_path / "mixed.jsonl", tasks[:4] + [old_style])
    rec, _ = _preflight(small_recipe(tiny_ladder, transfer__tasks=str(mixed)), bases, sft)
    assert rec["transfer_tasks"] == 5 and rec["probe_template_tasks"] == 1
    assert rec["probe_template_examples"][0][:2] == ["t-eq", "arith_pattern"]
    lines = _leakage_lines(rec)
    assert any("1 of 5 transfer task(s) are written in a built-in probe family" in ln and "`t-eq`" in ln
               for ln in lines)
    assert _leakage_lines({}) == []  # manifests written before the count existed: nothing claimed
