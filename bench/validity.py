"""Does the predeclared pipeline pick the base that is truly best? Validation on toy seeds.

Run from the repository root (documented with results in bench/VALIDITY.md):

    python bench/validity.py --seeds 0 1 2 3 4 --out results/validity
    python bench/validity.py --seeds 0 --out /tmp/v --tiny          # smoke version (minutes)

For every toy seed S:

1. **Pipeline** -- ``probeselect run CONFIG out=OUT/seed<S> ladder.toy.seed=S`` (default
   CONFIG: recipes/demo.yaml): builds the (planted) toy ladder, scores, shortlists under the
   predeclared plan, pilots the shortlist at the pilot budget, selects and confirms.
2. **Ground truth** -- every checkpoint of the ladder is post-trained with the
   confirmation recipe of CONFIG (the confirmation budget) under ``--truth-seeds`` SFT
   seeds (default 6) and evaluated on the same transfer suite (task items only:
   ``transfer.robustness`` and ``transfer.heldout`` are off, which changes no task number).
   The truth value of a checkpoint is the plan's primary metric averaged over those seeds;
   truth's best is the best of them (the plan's constraints are applied as in selection).
3. **Planted ties** at the pilot budget (pilot recipe and seeds of CONFIG), each ranked
   with the plan's selection rule: ``twin`` -- truth's best checkpoint and a byte copy of it
   under another name; ``same_mode`` -- the last two checkpoints of the ladder (both after
   every planted window; when the truth itself separates them, the row says so and the
   pair is not counted as a tie).

Per-seed table ``OUT/validity.csv`` (and ``validity.md``): the ladder's planted dip on the
pipeline's own scores (``dip_pass``, ``dip_families`` = conflict families that dip and recover,
``capability_dips`` = capability families or held-out bpb that dip; criteria of
:func:`probeselect.toy.dip.check_planted_dip`) and ``final_heldout_arith``; ``pick`` (the pipeline's
recommendation, else its top pilot base), ``pick_window`` (its data window), ``truth_best``,
``agree`` (pick == truth_best, or the truth cannot separate the two: the plan's decision rule on
the truth runs of just these two bases says "no clear winner"; ``truth_separates_pick`` says when
it can), ``agree_strict`` (pick == truth_best),
``pick_truth_gap`` (truth value of truth_best minus that of pick, >= 0), ``latest`` /
``latest_agree`` / ``latest_truth_gap`` (the same for the naive baseline "post-train the latest
checkpoint": the probes only earn their keep on seeds where it disagrees and the pick agrees), ``kendall_tau``
(Kendall tau-b between the shortlist aggregate over every ranked candidate, oriented so
that higher = better, and the truth values), ``decision`` (the selection verdict and the
confirmation statement); and ``OUT/ties.csv``: one row per seed x tie with the verdict
and whether it is a false clear winner; ``OUT/truth_values.csv``: the truth value (and its SFT-seed
sd) of every checkpoint of every seed, with its data window. ``OUT/validity.json`` holds the totals and every
setting. Every stage is resumable (``probeselect run`` and ``run_pilot`` skip finished
work), so an interrupted validation continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from probeselect._io import atomic_write_csv, atomic_write_json, atomic_write_text  # noqa: E402
from probeselect._yaml import load_yaml  # noqa: E402

#: Overrides of the smoke version (``--tiny``): a 24-step ladder with 3 checkpoints, few probe
#: items, a few SFT steps and transfer items. For plumbing only; its numbers mean nothing.
TINY_RUN = ["ladder.toy.steps=24", "ladder.toy.save_every=8", "score.n_items=4", "score.seeds=[0]",
            "average=null"]
TINY_RECIPE = ["seeds=[0, 1]", "budget.optimizer_steps=4", "optimizer.warmup_steps=1", "eval.every=0", "checkpointing.every=4",
               "transfer.max_items=12", "transfer.robustness=null", "transfer.heldout=null"]


def _kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall tau-b of two equal-length vectors (NaN when fewer than 2 pairs or a constant vector)."""
    n = len(x)
    conc = disc = tx = ty = 0
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif dx == dy:
                conc += 1
            else:
                disc += 1
    denom = np.sqrt((conc + disc + tx) * (conc + disc + ty))
    return float((conc - disc) / denom) if denom > 0 else float("nan")


def _run_cfg(config: Path, out: Path, seed: int, tiny: bool) -> tuple[list[str], dict]:
    """Overrides for ``probeselect run`` and the resolved config."""
    from probeselect.run import load_run_config

    ov = [f"out={out}", f"ladder.toy.seed={seed}"]
    raw = load_yaml(config)
    if tiny:
        ov += TINY_RUN
        # a 24-step model passes no capability floor or termination constraint: the smoke plan drops them
        import yaml

        plan = load_yaml(Path(raw["plan"]))
        plan["constraints"] = {}
        plan.setdefault("selection", {})["constraints"] = []
        tiny_plan = out.parent / "tiny-plan.yaml"
        tiny_plan.parent.mkdir(parents=True, exist_ok=True)
        if not tiny_plan.is_file():
            atomic_write_text(tiny_plan, "# bench/validity.py --tiny: recipes/selection.yaml without constraints\n"
                              + yaml.safe_dump(plan, sort_keys=False))
        ov.append(f"plan={tiny_plan}")
        for k in ("pilot", "confirm"):
            if raw.get(k):
                extra = list(raw[k].get("overrides") or []) + TINY_RECIPE
                ov.append(f"{k}.overrides={json.dumps(extra)}")
    return ov, load_run_config(config, ov)


def _spec(cfg: dict):
    from probeselect.plan import load_selection_plan

    return load_selection_plan(cfg["plan"]).selection


def _rank(pilot_dir: Path, spec, bases: list[str] | None = None):
    from probeselect.select import load_pilot_tables, rank_bases

    return rank_bases(load_pilot_tables(pilot_dir), spec, bases=bases)


def _pilot(bases, recipe: str, out: Path, overrides: list[str], seeds: list[int] | None, device: str,
           extra: list[str] = ()) -> None:
    from probeselect.pilot import run_pilot

    ov = list(overrides) + list(extra) + ([f"seeds={json.dumps(seeds)}"] if seeds is not None else [])
    run_pilot(bases, recipe, out, progress=False, device=device, overrides=ov)


# ---------------------------------------------------------------------------
# Stages. Each runs in a worker process (single-threaded torch) or in the main process
# (``jobs=1``); the scheduler in :func:`validate` runs them as soon as their inputs exist, so
# ``jobs`` workers stay busy: a seed's pipeline, then one ground-truth task per checkpoint, then
# its two planted ties, then its row (cheap, in the main process).
# ---------------------------------------------------------------------------


def _stage_pipeline(seed: int, out_root: Path, config: Path, tiny: bool) -> dict:
    """``probeselect run CONFIG`` for one seed; returns its ladder's checkpoint names and the seconds."""
    from probeselect.checkpoints import discover_checkpoints
    from probeselect.run import run_pipeline

    out = out_root / f"seed{seed}"
    ov, cfg = _run_cfg(config, out, seed, tiny)
    t0 = time.perf_counter()
    run_pipeline(config, overrides=ov, progress=False, log=lambda m: None)
    return {"checkpoints": [c.name for c in discover_checkpoints(Path(cfg["_paths"]["ladder"]))],
            "seconds": time.perf_counter() - t0}


def _truth_extra(tiny: bool) -> list[str]:
    return ["transfer.robustness=null", "transfer.heldout=null", "eval.every=0"] + (TINY_RECIPE if tiny else [])


def _stage_truth(seed: int, out_root: Path, config: Path, tiny: bool, truth_seeds: int, checkpoint: str) -> float:
    """Ground truth for one checkpoint: the confirmation recipe under ``truth_seeds`` SFT seeds, into
    ``OUT/seed<S>/truth/parts/<checkpoint>`` (merged by :func:`_merge_truth`). Returns the seconds."""
    out = out_root / f"seed{seed}"
    _, cfg = _run_cfg(config, out, seed, tiny)
    conf_cfg = cfg.get("confirm") or cfg["pilot"]
    t0 = time.perf_counter()
    _pilot([Path(cfg["_paths"]["ladder"]) / checkpoint], conf_cfg["recipe"], out / "truth" / "parts" / checkpoint,
           list(conf_cfg.get("overrides") or []), list(range(truth_seeds)), str(cfg.get("device", "auto")),
           extra=_truth_extra(tiny))
    return time.perf_counter() - t0


#: Tables of a pilot folder that the truth's per-checkpoint parts are merged into.
_TRUTH_TABLES = ("transfer.csv", "transfer_base.csv", "diagnostics.csv", "transfer_items.parquet")


def _merge_truth(truth_dir: Path, checkpoints: list[str]) -> None:
    """Concatenate the per-checkpoint truth parts into one pilot folder that the selection code
    reads. Every part trained under the same SFT data manifests (the matched-pilot guarantee);
    a part whose manifest differs is an error, not a silent merge."""
    parts = [truth_dir / "parts" / c for c in checkpoints]
    ref = sorted(p.name for p in parts[0].glob("data_manifest-seed*.json"))
    for p in parts:
        if sorted(q.name for q in p.glob("data_manifest-seed*.json")) != ref or any(
                (p / n).read_bytes() != (parts[0] / n).read_bytes() for n in ref):
            raise RuntimeError(f"{p}: its SFT data manifests differ from {parts[0]}'s; the truth parts are "
                               f"not matched. Delete {truth_dir} and rerun.")
    for n in ref:
        atomic_write_text(truth_dir / n, (parts[0] / n).read_text(encoding="utf-8"))
    for name in _TRUTH_TABLES:
        frames = [pd.read_parquet(p / name) if name.endswith(".parquet") else pd.read_csv(p / name)
                  for p in parts if (p / name).is_file()]
        if not frames:
            continue
        df = pd.concat(frames, ignore_index=True)
        if name.endswith(".parquet"):
            tmp = truth_dir / (name + ".tmp")
            df.to_parquet(tmp, index=False)
            tmp.replace(truth_dir / name)
        else:
            atomic_write_csv(truth_dir / name, df)


def _tie_bases(seed: int, out_root: Path, config: Path, tiny: bool) -> list[tuple[str, list[str], bool]]:
    """The two planted ties of a seed (name, base paths, whether the truth itself calls it a tie);
    needs the merged truth. (The row ranks the truth again in the main process: a bootstrap of a
    few seconds, cheaper than passing the ranking between processes.)"""
    from probeselect.checkpoints import discover_checkpoints

    out = out_root / f"seed{seed}"
    _, cfg = _run_cfg(config, out, seed, tiny)
    spec_truth = _truth_spec(_spec(cfg))
    truth = _rank(out / "truth", spec_truth)
    ckpts = discover_checkpoints(Path(cfg["_paths"]["ladder"]))
    src = next(c for c in ckpts if c.name == truth.top)
    last2 = [c for c in ckpts if c.step is not None][-2:]
    twin = out / "ties" / "twin" / "bases" / f"twin-of-{src.name}"
    return [("twin", [str(src.path), str(twin)], True),
            ("same_mode", [str(c.path) for c in last2],
             _rank(out / "truth", spec_truth, [c.name for c in last2]).verdict != "winner")]


def _stage_tie(seed: int, out_root: Path, config: Path, tiny: bool, name: str, bases: list[str]) -> float:
    """Pilot one planted tie at the pilot budget (the twin's byte copy is made here)."""
    out = out_root / f"seed{seed}"
    _, cfg = _run_cfg(config, out, seed, tiny)
    t0 = time.perf_counter()
    if name == "twin":
        src, copy = Path(bases[0]), Path(bases[1])
        if not (copy / "config.json").is_file():
            shutil.rmtree(copy, ignore_errors=True)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, copy)
    pilot_cfg = cfg["pilot"]
    _pilot(bases, pilot_cfg["recipe"], out / "ties" / name / "pilot", list(pilot_cfg.get("overrides") or []), None,
           str(cfg.get("device", "auto")), extra=TINY_RECIPE if tiny else [])
    return time.perf_counter() - t0


def _truth_spec(spec):
    """The plan's selection spec for the truth: without the ``robust_recovery`` floor (the truth
    runs skip the robustness items)."""
    if any(c.metric in ("robust_recovery",) for c in getattr(spec, "constraints", ())):
        import dataclasses

        return dataclasses.replace(spec, constraints=tuple(c for c in spec.constraints
                                                           if c.metric != "robust_recovery"))
    return spec


def _seed_row(seed: int, out_root: Path, config: Path, tiny: bool, truth_seeds: int, ties_spec, secs: dict
              ) -> tuple[dict, list[dict]]:
    """The validity row and tie rows of a seed whose pipeline, truth and ties are on disk."""
    from probeselect.checkpoints import discover_checkpoints

    out = out_root / f"seed{seed}"
    _, cfg = _run_cfg(config, out, seed, tiny)
    run_dir = Path(cfg["_paths"]["run"])
    ladder = Path(cfg["_paths"]["ladder"])
    spec = _spec(cfg)
    sel = json.loads((run_dir / "selection.json").read_text(encoding="utf-8"))
    conf = json.loads((run_dir / "confirm.json").read_text(encoding="utf-8")) if (run_dir / "confirm.json").is_file() \
        else None
    r = sel["decision"]
    pick = r.get("recommended") or r.get("top")
    verdict = r.get("verdict")
    ckpts = discover_checkpoints(ladder)

    spec_truth = _truth_spec(spec)
    truth = _rank(out / "truth", spec_truth)
    tt = truth.table.set_index("base")
    truth_best = truth.top
    sign = 1.0 if spec.direction == "higher" else -1.0
    truth_val = tt["value"].astype(float)
    gap = float(sign * (truth_val[truth_best] - truth_val[pick])) if pick in tt.index else float("nan")

    sl = pd.read_csv(run_dir / "shortlist.csv")
    agg_col = next(c for c in ("mean_rank", "median_rank") if c in sl.columns)
    sl = sl[sl[agg_col].notna() & sl["checkpoint"].astype(str).isin(tt.index)]
    tau = _kendall_tau_b(-sl[agg_col].to_numpy(float), sign * truth_val.reindex(sl["checkpoint"].astype(str)).to_numpy())

    ties = []
    for name, bases, truth_tie in ties_spec:
        rk = _rank(out / "ties" / name / "pilot", spec)
        ties.append({"seed": seed, "tie": name, "bases": " vs ".join(Path(b).name for b in bases),
                     "truth_is_tie": bool(truth_tie), "verdict": rk.verdict, "diff": rk.diff,
                     "diff_ci_low": rk.diff_ci[0] if rk.diff_ci else None,
                     "diff_ci_high": rk.diff_ci[1] if rk.diff_ci else None,
                     "false_clear_winner": bool(truth_tie and rk.verdict == "winner")})
    conf_line = (conf or {}).get("statement") or ""
    shortlisted = {str(x["checkpoint"]) for x in
                   json.loads((run_dir / "shortlist.json").read_text(encoding="utf-8"))["selected"]}
    # Tie-aware agreement: when the truth itself (every checkpoint, truth_seeds SFT seeds at the
    # confirmation budget) cannot separate the pick from its best under the plan's own decision
    # rule, the pick is one of the truly best bases.
    if pick == truth_best or pick not in tt.index:
        truth_vs_pick = "same" if pick == truth_best else "pick not in truth"
    else:
        truth_vs_pick = _rank(out / "truth", spec_truth, [truth_best, pick]).verdict
    # The naive baseline a probe-based pick must beat: post-train the latest checkpoint. Scored
    # with the same tie-aware rule; when it agrees as often as the pick, the validation cannot
    # tell the probes from "take the latest".
    latest = [c for c in ckpts if c.step is not None][-1].name
    if latest == truth_best or latest not in tt.index:
        truth_vs_latest = "same" if latest == truth_best else "latest not in truth"
    else:
        truth_vs_latest = _rank(out / "truth", spec_truth, [truth_best, latest]).verdict
    latest_gap = float(sign * (truth_val[truth_best] - truth_val[latest])) if latest in tt.index else float("nan")
    windows = _windows_of(ladder)
    scols = [c for c in tt.columns if c.startswith("seed") and c[4:].isdigit()]
    truth_rows = [{"seed": seed, "checkpoint": b, "window": windows.get(b, ""), "truth_value": float(truth_val[b]),
                   "truth_seed_sd": float(np.std(tt.loc[b, scols].to_numpy(float), ddof=1)) if len(scols) > 1
                   else float("nan"), "eligible": bool(tt.loc[b, "eligible"]),
                   "shortlisted": b in shortlisted, "pick": b == pick} for b in tt.index]
    atomic_write_csv(out / "truth_values.csv", pd.DataFrame(truth_rows).sort_values("checkpoint", key=lambda c: c.map(
        lambda n: int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else 0)))
    row = {"seed": seed, **_dip_columns(run_dir, ladder), "pick": pick, "pick_window": windows.get(pick, ""), "truth_best": truth_best,
           "agree": bool(pick == truth_best or truth_vs_pick == "no_clear_winner"),
           "agree_strict": bool(pick == truth_best), "truth_separates_pick": bool(pick != truth_best and truth_vs_pick != "no_clear_winner"),
           "pick_truth_gap": gap, "latest": latest,
           "latest_agree": bool(latest == truth_best or truth_vs_latest == "no_clear_winner"),
           "latest_truth_gap": latest_gap, "kendall_tau": tau, "n_ranked": int(len(sl)),
           "shortlist": " ".join(f"{x['checkpoint']}({windows.get(str(x['checkpoint']), '?')})" for x in
                                 json.loads((run_dir / "shortlist.json").read_text(encoding="utf-8"))["selected"]),
           "decision": verdict, "confirmation": conf_line, "truth_verdict": truth.verdict,
           "truth_seeds": truth_seeds, "seconds_pipeline": round(secs.get("pipeline", 0.0), 1),
           "seconds_truth": round(secs.get("truth", 0.0), 1), "seconds_ties": round(secs.get("ties", 0.0), 1)}
    return row, ties




def validate_seed(seed: int, out_root: Path, *, config: Path, truth_seeds: int, tiny: bool,
                  log=print) -> tuple[dict, list[dict]]:
    """Validate one toy seed in this process (the stages of :func:`validate`, one after the
    other); returns (validity row, tie rows)."""
    config = Path(config)
    log(f"[seed {seed}] pipeline: probeselect run {config} out={out_root / f'seed{seed}'} ladder.toy.seed={seed}")
    p = _stage_pipeline(seed, out_root, config, tiny)
    secs = {"pipeline": p["seconds"], "truth": 0.0, "ties": 0.0}
    log(f"[seed {seed}] truth: {len(p['checkpoints'])} checkpoints x {truth_seeds} SFT seeds")
    for c in p["checkpoints"]:
        secs["truth"] += _stage_truth(seed, out_root, config, tiny, truth_seeds, c)
    _merge_truth(out_root / f"seed{seed}" / "truth", p["checkpoints"])
    ties_spec = _tie_bases(seed, out_root, config, tiny)
    for name, bases, _tie in ties_spec:
        log(f"[seed {seed}] tie {name}: {[Path(b).name for b in bases]}")
        secs["ties"] += _stage_tie(seed, out_root, config, tiny, name, bases)
    return _seed_row(seed, out_root, config, tiny, truth_seeds, ties_spec, secs)


def _windows_of(ladder: Path) -> dict:
    """checkpoint name -> data window (from the ladder's data_lineage.json; {} without one)."""
    from probeselect.checkpoints import discover_checkpoints
    lin = ladder / "data_lineage.json"
    if not lin.is_file():
        return {}
    wins = json.loads(lin.read_text(encoding="utf-8"))["windows"]
    out = {}
    for c in discover_checkpoints(ladder):
        for w in wins:
            if c.step is not None and int(w["start_step"]) < c.step <= int(w["end_step"]):
                out[c.name] = str(w["name"])
    return out


def _dip_columns(run_dir: Path, ladder: Path) -> dict:
    """The planted-dip criteria (:func:`probeselect.toy.dip.check_planted_dip`) on the pipeline's own
    scores of this ladder, and the ladder's final held-out arithmetic accuracy."""
    from probeselect.toy.dip import check_planted_dip

    info = json.loads((ladder / "ladder.json").read_text(encoding="utf-8"))
    out = {"final_heldout_arith": info.get("final_heldout_arith_accuracy")}
    lin, sc = ladder / "data_lineage.json", run_dir / "scores.parquet"
    if not lin.is_file() or not sc.is_file():
        return {**out, "dip_pass": None, "dip_families": "", "capability_dips": ""}
    summ = run_dir / "summary.csv"
    v = check_planted_dip(pd.read_parquet(sc), pd.read_csv(summ) if summ.is_file() else None, lin)
    fams = sorted({f for w in v["windows"] for f in w["dipped_and_recovered"]})
    bad = sorted({f for w in v["windows"] for f in w["capability_dipped"]}
                 | ({"heldout_bpb"} if any(w["bpb_dipped"] for w in v["windows"]) else set()))
    return {**out, "dip_pass": bool(v["pass"]), "dip_families": " ".join(fams), "capability_dips": " ".join(bad)}


def _init_worker() -> None:
    """Worker processes run torch single-threaded: ``jobs`` single-threaded workers fill ``jobs``
    cores; more threads than cores make every small kernel wait for the others (scoring with the
    default thread count in five processes on 2 cores was 20-30x slower than alone)."""
    import torch

    torch.set_num_threads(1)


def _markdown(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        out.append("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(out)


def _schedule(seeds, out: Path, config: Path, truth_seeds: int, tiny: bool, jobs: int, log, keep) -> None:
    """Run every stage of every seed on ``jobs`` single-threaded worker processes, each stage as
    soon as its inputs exist: pipelines first, then one truth task per checkpoint of a finished
    pipeline, then a seed's two ties once its truth is complete. Tasks are minutes long, so the
    workers stay busy to the end (a process per seed would leave cores idle at the tail, and five
    processes on two cores lose time to sharing caches)."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned workers
    secs = {s: {"pipeline": 0.0, "truth": 0.0, "ties": 0.0} for s in seeds}
    left: dict[int, set] = {}
    ckpts_of: dict[int, list] = {}
    ties_of: dict[int, list] = {}
    with ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker) as ex:
        pending = {}
        for s in seeds:
            log(f"[seed {s}] pipeline: probeselect run {config} out={out / f'seed{s}'} ladder.toy.seed={s}")
            pending[ex.submit(_stage_pipeline, s, out, config, tiny)] = ("pipeline", s, None)
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: (pending[f][1], pending[f][0], str(pending[f][2]))):
                kind, s, what = pending.pop(f)
                res = f.result()  # a failed stage stops the validation with its own error
                if kind == "pipeline":
                    secs[s]["pipeline"] = res["seconds"]
                    left[s] = set(res["checkpoints"])
                    log(f"[seed {s}] truth: {len(res['checkpoints'])} checkpoints x {truth_seeds} SFT seeds")
                    for c in res["checkpoints"]:
                        pending[ex.submit(_stage_truth, s, out, config, tiny, truth_seeds, c)] = ("truth", s, c)
                    ckpts_of[s] = list(res["checkpoints"])
                elif kind == "truth":
                    secs[s]["truth"] += res
                    left[s].discard(what)
                    if not left[s]:
                        _merge_truth(out / f"seed{s}" / "truth", ckpts_of[s])
                        spec = _tie_bases(s, out, config, tiny)
                        ties_of[s] = spec
                        left[s] = {name for name, _, _ in spec}
                        for name, bases, _tie in spec:
                            log(f"[seed {s}] tie {name}: {[Path(b).name for b in bases]}")
                            pending[ex.submit(_stage_tie, s, out, config, tiny, name, bases)] = ("tie", s, name)
                else:
                    secs[s]["ties"] += res
                    left[s].discard(what)
                    if not left[s]:
                        keep(*_seed_row(s, out, config, tiny, truth_seeds, ties_of[s], secs[s]))


def validate(seeds: list[int], out: Path, *, config: Path = ROOT / "recipes" / "demo.yaml", truth_seeds: int = 6,
             tiny: bool = False, log=print, jobs: int = 1) -> dict:
    """Validate every seed; write validity.csv/.md, ties.csv and validity.json. ``jobs=1``: the
    seeds one after the other in this process (:func:`validate_seed`); ``jobs>1``: every stage of
    every seed on ``jobs`` single-threaded worker processes (:func:`_schedule`; same results)."""
    out = Path(out)
    rows, ties = [], []
    t0 = time.perf_counter()

    def _keep(row, tie):
        rows.append(row)
        ties.extend(tie)
        rows.sort(key=lambda r: seeds.index(r["seed"]))
        atomic_write_csv(out / "validity.csv", pd.DataFrame(rows))
        atomic_write_csv(out / "ties.csv", pd.DataFrame(sorted(ties, key=lambda t: (seeds.index(t["seed"]), t["tie"]))))

    if jobs > 1:
        _schedule(seeds, out, Path(config), truth_seeds, tiny, jobs, log, _keep)
    else:
        for s in seeds:
            _keep(*validate_seed(s, out, config=Path(config), truth_seeds=truth_seeds, tiny=tiny, log=log))
    df = pd.DataFrame(rows)
    tdf = pd.DataFrame(sorted(ties, key=lambda t: (seeds.index(t["seed"]), t["tie"])))
    tv = [out / f"seed{s}" / "truth_values.csv" for s in seeds]
    if all(p.is_file() for p in tv):
        atomic_write_csv(out / "truth_values.csv", pd.concat([pd.read_csv(p) for p in tv], ignore_index=True))
    counted = tdf[tdf["truth_is_tie"]]
    totals = {"seeds": seeds, "agree": int(df["agree"].sum()), "agree_strict": int(df["agree_strict"].sum()),
              "latest_agree": int(df["latest_agree"].sum()),
              "dip_pass": int(df["dip_pass"].fillna(False).astype(bool).sum()),
              "n": len(df), "jobs": jobs,
              "false_clear_winners": int(counted["false_clear_winner"].sum()), "ties_counted": len(counted),
              "mean_kendall_tau": float(df["kendall_tau"].mean()), "seconds": round(time.perf_counter() - t0, 1),
              "config": str(config), "truth_seeds": truth_seeds, "tiny": tiny}
    atomic_write_json(out / "validity.json", totals)
    atomic_write_text(out / "validity.md", _markdown(df) + "\n\n" + _markdown(tdf) + "\n\n"
                      + f"agreement {totals['agree']}/{totals['n']} (pick = truth's best, or the truth cannot "
                        f"separate them: {totals['agree']}; pick = truth's best exactly: {totals['agree_strict']}); "
                        f"baseline 'take the latest checkpoint' agrees on {totals['latest_agree']}/{totals['n']}; "
                        f"false clear winners on ties "
                        f"{totals['false_clear_winners']}/{totals['ties_counted']}\n")
    return totals


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="toy seeds (default 0 1 2 3 4)")
    ap.add_argument("--out", type=Path, default=Path("results/validity"))
    ap.add_argument("--config", type=Path, default=ROOT / "recipes" / "demo.yaml", help="pipeline config")
    ap.add_argument("--truth-seeds", type=int, default=6, help="SFT seeds of the ground truth (default 6)")
    ap.add_argument("--tiny", action="store_true", help="smoke version: tiny ladder and budgets (plumbing only)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1 = in this process; "
                    "on N cores use N: every stage runs single-threaded, the seeds' stages are scheduled across the workers)")
    a = ap.parse_args(argv)
    if a.truth_seeds < 1:
        ap.error("--truth-seeds must be >= 1")
    totals = validate(a.seeds, a.out, config=a.config, truth_seeds=a.truth_seeds, tiny=a.tiny, jobs=a.jobs)
    print((a.out / "validity.md").read_text(encoding="utf-8"))
    print(json.dumps(totals))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
