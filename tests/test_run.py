"""`probeselect run CONFIG`: stage order, skipping of up-to-date stages, reruns on changed
inputs, POST-HOC stop after a plan edit. Real scoring on the tiny ladder; run_pilot is
monkeypatched (test_run_end_to_end_with_the_real_pilot uses the real one)."""

import json
import time
from pathlib import Path

import pandas as pd
import pytest
from _selection_fakes import write_fake_pilot

import probeselect.confirm as confirm_mod
from probeselect.cli import main
from probeselect.errors import PostHocError
from probeselect.run import RunConfigError, load_run_config, run_pipeline

REPO = Path(__file__).resolve().parents[1]

PLAN = """\
proxies:
  - {family: arith_pattern, variant: "*", metric: mean_margin}
  - {family: tmpl_repeated, variant: "*", metric: mean_margin}
k: 2
selection:
  primary: {metric: task_accuracy}
  constraints: [{metric: termination, min: 0.5}]
  decision: {tie_margin: 0.0}
  uncertainty: {bootstrap: 200}
"""


def _config(tmp_path, ladder, confirm=True, tie_margin=0.0) -> Path:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("tie_margin: 0.0", f"tie_margin: {tie_margin}"))
    cfg = {
        "out": str(tmp_path / "out"),
        "ladder": str(ladder),
        "score": {"probes": [str(REPO / "probes/arith_pattern.yaml"), str(REPO / "probes/tmpl_repeated.yaml")],
                  "seeds": [0], "n_items": 3, "audit_items": 0, "heldout": "{ladder}/data/heldout.txt"},
        "plan": str(plan),
        "pilot": {"recipe": "recipes/pilot.yaml", "overrides": [
                     "data.train={ladder}/data/sft.jsonl", "transfer.tasks={ladder}/data/transfer.jsonl",
                     "transfer.robustness={ladder}/data/robustness.jsonl",
                     "transfer.heldout={ladder}/data/sft_heldout.jsonl"]},
        "confirm": {"recipe": "recipes/confirm.yaml", "top": 2} if confirm else None,
        "select": {"allow_post_hoc": False, "allow_weak": True},  # k = 2 bases cannot beat the proxy null
        "device": "cpu",
    }
    p = tmp_path / "run.yaml"
    p.write_text(json.dumps(cfg))
    return p


PLANTED = {"winner": lambda i: {"task_accuracy": 0.95 if i == 0 else 0.2, "termination": 0.9},
           "tie": lambda i: {"task_accuracy": 0.6, "termination": 0.9}}


def _fake_pilot(monkeypatch, planted):
    """run_pilot replaced by synthetic tables (3 SFT seeds, 200 items): with "winner" the first shortlisted
    base is far better than the others (95% vs 20% accuracy, so every interval is far above 0); with "tie"
    every base has the same pilot rows (same rng for each), so every paired seed difference is exactly 0."""
    calls = []

    def run_pilot(bases, recipe, out_dir, *, progress=True, device="auto", overrides=()):
        calls.append((str(bases) if not isinstance(bases, list) else [Path(b).name for b in bases], str(out_dir),
                      list(overrides)))
        if isinstance(bases, list):
            names = [Path(b).name for b in bases]
        else:
            sl = pd.read_csv(bases)
            names = list(sl.loc[sl["selected"], "checkpoint"])
        if planted == "tie":
            parts = Path(str(out_dir) + "_parts")
            for n in names:  # identical rows per base: a tie by construction
                write_fake_pilot(parts / n, {n: PLANTED["tie"](0)}, n_items=200)
            _merge(Path(out_dir), [parts / n for n in names], names)
        else:
            write_fake_pilot(Path(out_dir), {n: PLANTED[planted](i) for i, n in enumerate(names)}, n_items=200)

    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", lambda: run_pilot)
    return calls


def _merge(out: Path, parts: list[Path], names: list[str]) -> None:
    from probeselect._io import atomic_write_csv, atomic_write_json, atomic_write_parquet

    atomic_write_json(out / "manifest.json", {"kind": "pilot", "bases": [{"name": b, "path": f"/ladder/{b}"}
                                                                        for b in names]})
    for name in ("transfer.csv", "diagnostics.csv"):
        atomic_write_csv(out / name, pd.concat([pd.read_csv(p / name) for p in parts]))
    atomic_write_parquet(out / "transfer_items.parquet",
                         pd.concat([pd.read_parquet(p / "transfer_items.parquet") for p in parts]))


@pytest.fixture
def fake_pilot(monkeypatch):
    return _fake_pilot(monkeypatch, "winner")


def test_config_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("out: x\nladder: y\nscore: {probes: [a.yaml], itemz: 3}\nplan: p.yaml\npilot: {recipe: r.yaml}\n")
    with pytest.raises(RunConfigError, match="unknown key 'itemz'"):
        load_run_config(p)
    with pytest.raises(RunConfigError, match="unknown key 'confrim'"):
        load_run_config(p, ["confrim.top=2"])
    with pytest.raises(RunConfigError, match=r"unknown key pilot.'job'.*jobs"):
        load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", "pilot.job=2"])
    for bad in ("0", "two", "true"):
        with pytest.raises(RunConfigError, match="confirm.jobs must be an integer >= 1"):
            load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", f"confirm.jobs={bad}"])
    assert load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", "pilot.jobs=3"])["pilot"]["jobs"] == 3
    for bad in ("[newest]", "[latest, latest]", "latest"):
        with pytest.raises(RunConfigError, match=r"confirm.references must be a list of distinct naive choices"):
            load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", f"confirm.references={bad}"])
    with pytest.raises(RunConfigError, match=r"unknown key pilot.'references'"):  # the pilot's come from the plan
        load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", "pilot.references=[latest]"])
    assert load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", "confirm.references=[lowest_bpb, latest]"]
                           )["confirm"]["references"] == ["lowest_bpb", "latest"]
    cfg = load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x"])
    assert cfg["_paths"]["ladder"] == "/tmp/x/ladder" and "{ladder}" not in json.dumps(cfg)
    for bad, msg in (("replicate=[1]", "`replicate:` must be a mapping"), ("replicate={seed: [3]}", "must be a mapping"),
                     ("replicate.seeds=[3, 3]", "replicate.seeds must be a non-empty list of distinct"),
                     ("replicate.seeds=[-1]", "replicate.seeds must be"), ("replicate.jobs=0", "replicate.jobs must")):
        with pytest.raises(RunConfigError, match=msg):
            load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", bad])
    with pytest.raises(RunConfigError, match="`replicate:` re-tests a claim of the confirmation, so it needs `confirm:`"):
        load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", "confirm=null", "replicate={}"])
    assert load_run_config(REPO / "recipes" / "demo.yaml", ["out=/tmp/x", "replicate.seeds=[12, 13]"]
                           )["replicate"] == {"seeds": [12, 13]}


def test_run_skips_up_to_date_stages_and_marks_post_hoc(tmp_path, tiny_ladder, fake_pilot):
    cfg = _config(tmp_path, tiny_ladder)
    res = run_pipeline(cfg, progress=False, log=lambda m: None)
    status = {s.name: s.status for s in res.stages}
    assert status == {"ladder": "off", "score": "ran", "average": "off", "dynamics": "ran", "shortlist": "ran", "lock": "ran",
                      "pilot": "ran", "select": "ran", "confirm": "ran", "replicate": "off", "report": "ran"}
    run = tmp_path / "out" / "score"
    for f in ("summary.csv", "shortlist.csv", "plan.lock.json", "pilot/transfer.csv", "selection.json",
              "confirm.json", "report.md", "report.html"):
        assert (run / f).is_file(), f
    sel = json.loads((run / "selection.json").read_text())
    assert sel["status"] == "predeclared" and sel["lock"]["outcome_files_at_lock"] == []
    assert sel["lock"]["plan_sha256"] and json.loads((run / "plan.lock.json").read_text())["shortlist_files_at_lock"] == []
    # the planted winner (the first shortlisted base) is found, and the confirmation (same fake) holds it
    first = pd.read_csv(run / "shortlist.csv").query("selected")["checkpoint"].iloc[0]  # fake_pilot's planted winner
    assert sel["decision"]["verdict"] == "winner" and sel["decision"]["recommended"] == first
    assert json.loads((run / "confirm.json").read_text())["held"] is True
    assert fake_pilot[0][0].endswith("shortlist.csv") and fake_pilot[0][2][0].startswith(f"data.train={tiny_ladder}")
    assert len(fake_pilot[1][0]) == 2  # confirm: top 2 by name
    state = json.loads((tmp_path / "out" / "run_state.json").read_text())
    assert set(state["stages"]) == {"score", "dynamics", "shortlist", "lock", "pilot", "select", "confirm", "report"}
    assert [s.name for s in res.stages].index("lock") < [s.name for s in res.stages].index("shortlist")

    # second run: nothing to do
    res2 = run_pipeline(cfg, progress=False, log=lambda m: None)
    assert {s.name: s.status for s in res2.stages if s.name not in ("ladder", "average", "replicate")} == {
        n: "skipped" for n in state["stages"]}
    assert len(fake_pilot) == 2

    # a tampered output reruns its stage; it restores the same selection, so selection.json keeps its bytes
    # (whatever the clock says: the sleep makes its time stamp differ) and the confirmation, which pins
    # selection.json's sha256, is not retrained for nothing
    sel_bytes = (run / "selection.json").read_bytes()
    time.sleep(1.1)
    (run / "selection.csv").write_text("tampered\n")
    res3 = run_pipeline(cfg, progress=False, log=lambda m: None)
    ran = [s.name for s in res3.stages if s.status == "ran"]
    assert ran == ["select"] and (run / "selection.json").read_bytes() == sel_bytes
    assert len(fake_pilot) == 2
    # a missing confirmation reruns it and the report
    (run / "confirm.json").unlink()
    res3b = run_pipeline(cfg, progress=False, log=lambda m: None)
    assert [s.name for s in res3b.stages if s.status == "ran"] == ["confirm", "report"]
    # confirm.references: the ladder's latest checkpoint and the lowest-bpb one are retrained next to the top 2
    # (a changed confirmation config reruns the confirmation and the report, nothing upstream)
    latest = max((p.name for p in Path(tiny_ladder).glob("checkpoint-*")), key=lambda n: int(n.split("-")[1]))
    n_calls = len(fake_pilot)
    res3c = run_pipeline(cfg, overrides=["confirm.references=[latest, lowest_bpb]"], progress=False,
                         log=lambda m: None)
    assert [s.name for s in res3c.stages if s.status == "ran"] == ["confirm", "report"]
    conf = json.loads((run / "confirm.json").read_text())
    refs = conf["references"]
    assert refs["latest"] == latest and set(refs) == {"latest", "lowest_bpb"}
    extra = [b for b in dict.fromkeys(refs.values()) if b not in fake_pilot[1][0]]
    assert fake_pilot[n_calls][0] == fake_pilot[1][0] + extra
    naive_line = next(ln for ln in (run / "report.md").read_text().splitlines() if "Against the naive choices" in ln)
    assert f"`{latest}` (the latest checkpoint" in naive_line and "at the confirmation budget it has" in naive_line
    # the same references in another order are the same inputs: nothing reruns
    res3d = run_pipeline(cfg, overrides=["confirm.references=[lowest_bpb, latest]"], progress=False,
                         log=lambda m: None)
    assert [s.name for s in res3d.stages if s.status == "ran"] == [] and len(fake_pilot) == n_calls + 1
    (run / "confirm.json").unlink()
    run_pipeline(cfg, progress=False, log=lambda m: None)  # back to the top 2 only
    n_calls = len(fake_pilot)
    res3e = run_pipeline(cfg, overrides=["confirm.references=[]"], progress=False, log=lambda m: None)
    assert [s.name for s in res3e.stages if s.status == "ran"] == [] and len(fake_pilot) == n_calls  # [] = none
    # replicate: {}: the pilot's winner was confirmed, so nothing is trained, and replicate.json says why
    res3f = run_pipeline(cfg, overrides=["replicate={}"], progress=False, log=lambda m: None)
    assert [s.name for s in res3f.stages if s.status == "ran"] == ["replicate", "report"]
    assert len(fake_pilot) == n_calls and json.loads((run / "replicate.json").read_text())["needed"] is False
    assert "Nothing to replicate" in (run / "report.md").read_text()

    # the plan edited after the lock: shortlist reruns, the lock is kept, select stops POST-HOC
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.replace("tie_margin: 0.0", "tie_margin: 0.5"))
    with pytest.raises(PostHocError, match="changed after it was locked"):
        run_pipeline(cfg, progress=False, log=lambda m: None)
    assert not (run / "selection.json").exists()  # the old predeclared selection is moved aside, not left current
    res4 = run_pipeline(cfg, overrides=["select.allow_post_hoc=true"], progress=False, log=lambda m: None)
    st4 = {s.name: s for s in res4.stages}
    assert st4["lock"].status == "skipped" and "POST-HOC" in st4["lock"].detail
    assert st4["select"].status == "ran" and st4["select"].detail.startswith("POST-HOC")
    assert (run / "report.md").read_text().startswith("# POST-HOC")


def test_cli_run_with_a_planted_tie_names_no_winner(tmp_path, tiny_ladder, monkeypatch, capsys):
    """Every shortlisted base gets the same pilot rows: the paired differences are exactly 0, so the only
    correct verdict is "no clear winner"."""
    calls = _fake_pilot(monkeypatch, "tie")
    cfg = _config(tmp_path, tiny_ladder, confirm=False)
    assert main(["run", str(cfg), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "confirm    off" in out and "report     ran" in out and "no clear winner" in out
    # issue 24: a given ladder folder is not "not configured", and the tie names no winner, not "no clear winner: X"
    assert f"existing ladder {tiny_ladder} (nothing to build)" in out and "no clear winner: " not in out
    assert "no clear winner (an interval of top - other overlaps the tie margin); best seed mean" in out
    sel = json.loads((tmp_path / "out" / "score" / "selection.json").read_text())
    assert sel["decision"]["verdict"] == "no_clear_winner" and sel["decision"]["recommended"] is None
    assert sel["decision"]["diff"] == 0 and sel["decision"]["diff_ci"] == [0, 0]
    assert "overlaps the tie margin" in sel["decision"]["reason"] and len(calls) == 1
    assert main(["run", str(cfg), "--no-progress", "--force", "report"]) == 0
    out = capsys.readouterr().out
    assert "report     ran" in out and "select     skipped" in out


def test_run_end_to_end_with_the_real_pilot(tmp_path, tiny_ladder):
    """The real pilot runner and transfer evaluation at a minimal budget (2 and 3 optimizer steps, one seed,
    8 transfer items): every stage runs, the selection is predeclared, the confirmation compares 2 bases."""
    heldout = tiny_ladder / "data" / "sft_heldout.jsonl"
    if not heldout.is_file() or not heldout.read_text().strip():
        # the tiny ladder may write no held-out SFT rows; any rows in the SFT format serve the mechanics
        heldout = tmp_path / "sft_heldout.jsonl"
        heldout.write_text("".join((tiny_ladder / "data" / "sft.jsonl").read_text().splitlines(keepends=True)[-8:]))
    small = ["data.train={ladder}/data/sft.jsonl", "transfer.tasks={ladder}/data/transfer.jsonl",
             "transfer.robustness={ladder}/data/robustness.jsonl", f"transfer.heldout={heldout}",
             "seeds=[0]", "transfer.max_items=8", "eval.every=0", "optimizer.warmup_steps=0"]
    cfg = json.loads(_config(tmp_path, tiny_ladder).read_text())
    cfg["plan"] = str(tmp_path / "plan.yaml")
    (tmp_path / "plan.yaml").write_text(PLAN.replace("k: 2", "k: 3").replace("task_accuracy", "task_logprob")
                                        .replace("min: 0.5", "min: 0.0"))
    cfg["score"]["n_items"] = 2
    cfg["average"] = {"window": 4}  # 8 checkpoints -> 5 averages, scored into RUN/averaged
    cfg["pilot"]["overrides"] = small + ["budget.optimizer_steps=2", "checkpointing.every=2"]
    cfg["confirm"]["overrides"] = small + ["budget.optimizer_steps=3", "checkpointing.every=3"]
    cfg["replicate"] = {}  # runs on the real confirmation's record (it trains only when the confirmation alone claimed)
    p = tmp_path / "e2e.yaml"
    p.write_text(json.dumps(cfg))
    res = run_pipeline(p, progress=False, log=lambda m: None)
    assert [s.status for s in res.stages] == ["off"] + ["ran"] * 10
    assert "needed" in json.loads((tmp_path / "out" / "score" / "replicate.json").read_text())
    run = tmp_path / "out" / "score"
    avg = pd.read_csv(run / "averaged" / "summary.csv")
    assert avg["checkpoint"].nunique() == 5 and (tmp_path / "out" / "ladder-avg4").is_dir()
    sel = json.loads((run / "selection.json").read_text())
    assert sel["status"] == "predeclared" and len(sel["bases"]) == 3
    # one SFT seed: no interval, so the only correct verdict is "no clear winner"
    assert sel["decision"]["verdict"] == "no_clear_winner" and sel["decision"]["reason"].startswith("one SFT seed")
    assert sel["n_sft_seeds"] == 1 and sel["decision"]["recommended"] is None
    conf = json.loads((run / "confirm.json").read_text())
    assert len(conf["bases"]) == 2 and conf["bases"] == [b["base"] for b in sel["bases"]][:2]
    diag = (run / "pilot" / "diagnostics.csv").read_text().splitlines()
    assert len(diag) == 1 + 3
    md = (run / "report.md").read_text()
    assert "## Run correctness" in md and "| base | seed | steps |" in md
    assert "## Averaging vs raw" in md
    # the bases' transfer before SFT, with the same harness, and the lift it implies
    base = pd.read_csv(run / "pilot" / "transfer_base.csv")
    assert set(base["seed"]) == {"base"} and base["base"].nunique() == 3
    assert "## SFT lift" in md


def test_run_binds_toy_world_families_to_the_ladder_seed():
    """`probeselect run` on toy seed S scores the world-S people and facts (a fixed world_seed: 0
    in the spec file would test facts a seed-S model never saw)."""
    from probeselect.run import _load_specs

    root = Path(__file__).resolve().parents[1]
    sc = {"probes": [str(root / "probes" / "tmpl_mismatch.yaml"), str(root / "probes" / "tmpl_flipped.yaml"),
                     str(root / "probes" / "capability" / "persona_plain.yaml")], "n_items": 4}
    specs = _load_specs(sc, 3)
    assert [s.params.get("world_seed") for s in specs] == [3, None, 3]
    assert all(s.n_items == 4 for s in specs)
    assert [s.params.get("world_seed") for s in _load_specs(sc)] == [0, None, 0]  # not a toy ladder: as written


def test_config_jobs_apply_on_cpu_and_cuda_not_on_other_accelerators(monkeypatch):
    """pilot.jobs / confirm.jobs are worker processes on the CPU or sharing one CUDA device: there the value
    passes through; on another accelerator the stage trains one base at a time and says so in the run log
    (the numbers do not depend on it)."""
    from types import SimpleNamespace

    import torch

    from probeselect import score
    from probeselect.run import _Pipeline

    logs = []
    monkeypatch.setattr(score, "resolve_device", lambda d: torch.device(d))
    mps = SimpleNamespace(device="mps", log=logs.append)
    assert _Pipeline._jobs(mps, "pilot", {"jobs": 2}) == 1
    assert logs and "pilot.jobs: 2 is for CPU and CUDA runs" in logs[0]
    gpu = SimpleNamespace(device="cuda", log=logs.append)
    assert _Pipeline._jobs(gpu, "pilot", {"jobs": 3}) == 3
    cpu = SimpleNamespace(device="cpu", log=logs.append)
    assert _Pipeline._jobs(cpu, "confirm", {"jobs": 2}) == 2 and _Pipeline._jobs(cpu, "pilot", {}) is None
    assert len(logs) == 1
