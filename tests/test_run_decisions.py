"""`probeselect run` end to end with planted pilot outcomes that a wrong pipeline would get wrong
(issue 29): real scoring, shortlist, lock, select and report on the tiny ladder; the pilot is
replaced by synthetic tables with 3 SFT seeds (tests/_selection_fakes.write_fake_pilot).

* planted winner: the LAST of the three shortlisted bases is far better, so a pipeline that
  recommends by shortlist order, or the worst base, is caught;
* planted top tie: the first and last shortlisted bases get identical pilot rows and the middle
  one is far worse, so a pipeline that compares the top with the worst base only (or ignores
  the runner-up) would wrongly name a winner.
"""

import json
from pathlib import Path

import pandas as pd
import pytest
from _selection_fakes import write_fake_pilot

import probeselect.confirm as confirm_mod
from probeselect._io import atomic_write_csv, atomic_write_json, atomic_write_parquet
from probeselect.run import run_pipeline

REPO = Path(__file__).resolve().parents[1]

PLAN = """\
proxies:
  - {family: arith_pattern, variant: "*", metric: mean_margin}
  - {family: tmpl_repeated, variant: "*", metric: mean_margin}
k: 3
selection:
  primary: {metric: task_accuracy}
  constraints: [{metric: termination, min: 0.5}]
  decision: {tie_margin: 0.02}
  uncertainty: {bootstrap: 200}
"""

SEEDS = (0, 1, 2)


def _merge(out: Path, parts: list[Path], names: list[str]) -> None:
    atomic_write_json(out / "manifest.json", {"kind": "pilot", "bases": [{"name": b, "path": f"/ladder/{b}"}
                                                                        for b in names]})
    for name in ("transfer.csv", "diagnostics.csv"):
        atomic_write_csv(out / name, pd.concat([pd.read_csv(p / name) for p in parts]))
    atomic_write_parquet(out / "transfer_items.parquet",
                         pd.concat([pd.read_parquet(p / "transfer_items.parquet") for p in parts]))


def _install_fake_pilot(monkeypatch, planted: dict):
    """planted: {"accuracy": [p0, p1, p2] by shortlist position, "rng": [r0, r1, r2] rng seeds};
    bases with the same rng seed and accuracy get identical rows (an exact tie)."""
    seen = []

    def run_pilot(bases, recipe, out_dir, *, progress=True, device="auto", overrides=()):
        sl = pd.read_csv(bases)
        names = list(sl.loc[sl["selected"], "checkpoint"])
        seen.append(names)
        parts = Path(str(out_dir) + "_parts")
        for n, p, r in zip(names, planted["accuracy"], planted["rng"]):
            write_fake_pilot(parts / n, {n: {"task_accuracy": p, "termination": 0.9}}, seeds=SEEDS, n_items=200,
                             rng_seed=r)
        _merge(Path(out_dir), [parts / n for n in names], names)

    monkeypatch.setattr(confirm_mod, "_load_pilot_fn", lambda: run_pilot)
    return seen


def _run(tmp_path, ladder):
    (tmp_path / "plan.yaml").write_text(PLAN)
    cfg = {"out": str(tmp_path / "out"), "ladder": str(ladder),
           "score": {"probes": [str(REPO / "probes/arith_pattern.yaml"), str(REPO / "probes/tmpl_repeated.yaml")],
                     "seeds": [0], "n_items": 3, "audit_items": 0},
           "plan": str(tmp_path / "plan.yaml"),
           "pilot": {"recipe": "recipes/pilot.yaml", "overrides": [
                     "data.train={ladder}/data/sft.jsonl", "transfer.tasks={ladder}/data/transfer.jsonl",
                     "transfer.robustness={ladder}/data/robustness.jsonl",
                     "transfer.heldout={ladder}/data/sft_heldout.jsonl"]},
           "confirm": None,
           "select": {"allow_post_hoc": False, "allow_weak": True},  # 3 bases cannot beat the proxy null
           "device": "cpu"}
    p = tmp_path / "run.yaml"
    p.write_text(json.dumps(cfg))
    run_pipeline(p, progress=False, log=lambda m: None)
    run = tmp_path / "out" / "score"
    return json.loads((run / "selection.json").read_text()), pd.read_csv(run / "selection.csv"), run


@pytest.mark.parametrize("case", ["winner_last", "top_tie"])
def test_run_names_the_planted_winner_and_no_winner_on_a_top_tie(case, tmp_path, tiny_ladder, monkeypatch):
    planted = {"winner_last": {"accuracy": [0.5, 0.5, 0.9], "rng": [0, 1, 2]},
               "top_tie": {"accuracy": [0.8, 0.2, 0.8], "rng": [7, 1, 7]}}[case]
    seen = _install_fake_pilot(monkeypatch, planted)
    sel, table, run = _run(tmp_path, tiny_ladder)
    (names,) = seen
    assert len(names) == 3 and sel["status"] == "predeclared" and sel["n_sft_seeds"] == len(SEEDS)
    d = sel["decision"]
    if case == "winner_last":
        assert d["verdict"] == "winner" and d["recommended"] == names[2] and d["top"] == names[2]
        assert d["diff_ci"][0] > 0.02  # the whole interval lies above the tie margin
        assert table.loc[table["recommended"], "base"].tolist() == [names[2]]
        assert "recommended" in (run / "report.md").read_text().lower()
    else:
        assert d["verdict"] == "no_clear_winner" and d["recommended"] is None
        assert {d["top"], d["runner_up"]} == {names[0], names[2]}
        assert d["diff"] == 0 and d["diff_ci"] == [0, 0]
        assert "overlaps the tie margin" in d["reason"]
        assert not table["recommended"].any()
        # the worse base is last, and far below: comparing the top with it alone would have named a winner
        assert table["base"].iloc[-1] == names[1]
