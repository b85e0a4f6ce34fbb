"""Does the predeclared pipeline pick the base that is truly best, and better than naive selectors?
Validation on toy seeds.

Run from the repository root (documented with results in bench/VALIDITY.md):

    python bench/validity.py --jobs 2 --out results/validity          # fresh seeds 5-9, 4 truth seeds
    python bench/validity.py --budget-estimate --jobs 2               # estimated CPU and wall time
    python bench/validity.py --seeds 0 --out /tmp/v --tiny            # smoke version (minutes)
    python bench/validity.py --curriculum late-harm uniform negative-control --jobs 2 --out OUT
                                          # one table per curriculum (OUT/<name>/) and a pooled one
    python bench/validity.py ... --record bench/validity_runs   # keep the run's small outputs in the repository
    python bench/validity.py --pool bench/validity_runs/A bench/validity_runs/B --out OUT   # pool, no training

Seeds 0-4 (:data:`DEV_SEEDS`) were used to tune the curriculum, the plan and the recipes; the
default seeds 5-9 (:data:`FRESH_SEEDS`) were not. validity.json records both.

For every toy seed S:

1. **Pipeline** -- ``probeselect run CONFIG out=OUT/seed<S> ladder.toy.seed=S`` (default
   CONFIG: recipes/demo.yaml): builds the (planted) toy ladder, scores, shortlists under the
   predeclared plan, pilots the shortlist at the pilot budget, selects and confirms.
2. **Independent ground truth** -- every checkpoint is post-trained with the confirmation
   recipe of CONFIG under ``--truth-seeds`` SFT seeds starting at 100 (default 100-103; the pilot
   and the confirmation use 0-2, so no data order or LoRA init is shared) and evaluated on the
   truth's own transfer suite ``OUT/seed<S>/truth/truth_transfer.jsonl``: the same kinds and sizes
   as the pilot's suite, drawn from another random stream (:data:`TRUTH_STREAM`) with every pilot
   prompt excluded (robustness and held-out SFT loss off). Truth value = the plan's primary
   metric averaged over those seeds; truth's best = the best base passing the plan's selection
   constraints (``truth_best``), also over all checkpoints (``truth_best_all``) and over the
   plan-eligible set (shortlist constraints: ``truth_best_plan_eligible``).
3. **Probe-free pilot** -- the pipeline's pilot recipe, seeds and budget on the last checkpoint of
   each data window (without a lineage: k evenly spaced checkpoints), ranked by the plan's rule.
4. **Planted ties** at the pilot budget, ranked with the plan's selection rule: ``twin`` -- two
   copies of the last checkpoint, each with an independent weight perturbation (sd
   ``--twin-noise`` x each tensor's sd): different but exchangeable, so truly equal; their own
   truth runs (the truth's seeds and suite) check that the truth cannot separate them;
   ``same_mode`` -- the last two checkpoints (counted as a tie only when the truth does not
   separate them). False-winner rate with its Clopper-Pearson interval in validity.json.

Selectors on the same truth (:data:`SELECTORS`; ``OUT/selectors.csv`` per seed,
``OUT/selector_summary.csv`` over seeds): ``pipeline`` (the confirmed recommendation; decisive only
when the confirmation names a clear winner -- or, under a plan with ``selection.decision.against``, a
base better than that default (:data:`DECISIVE`) -- and the pilot's decision held, else its top base is
scored as undecided; from 2026-12-06 (twenty-sixth session, declared for seeds 125 on) also decisive when
the pilot said ``beats_default`` and that claim, re-tested against the default alone, held at the
confirmation budget (``probeselect.final_report.confirmation_status``: "default_beaten"; the pick is then
the report's recommendation); from 2026-12-06 (twenty-seventh session, for configs with ``replicate:``) also
decisive when the confirmation made a claim of its own (the pilot named no winner, or its pick did not hold)
and the ``replicate`` stage held it on fresh SFT seeds ("replicated"; :mod:`probeselect.replicate`); the
probe-free pilot's verdict follows the pilot rule), ``latest``, ``lowest_bpb`` (pretraining held-out bits per byte),
``best_capability`` (mean capability candidate accuracy), ``probes_only`` (shortlist rank 1),
``probe_free_pilot``, ``random_k_pilot`` (expected over all k-subsets of the plan-eligible
checkpoints with an oracle pilot that picks each subset's truth-best: favourable to it) and
``random_eligible`` (exact expectation over the plan-eligible checkpoints). Metrics
(:func:`pick_metrics`): ``regret`` = truth's best minus the pick, with its paired-t 95% interval
over the truth seeds (mean, interval over seeds and max in the summary); ``agree`` (lenient: the
truth's own rule cannot separate pick and best), ``agree_strict`` (pick = best), ``equiv_agree``
(the upper end of the interval of best - pick is below the tie margin) and ``decisive_correct``
(decisive and equivalence-agreeing). ``validity.csv`` also holds Kendall tau-b of the truth values
with the shortlist aggregate (``tau_probes``), the step number (``tau_step``) and -bpb
(``tau_neg_bpb``), the planted-dip verdict and timings; ``truth_values.csv`` every checkpoint's
truth value. Every stage is resumable, and every finished task is logged with its seconds; the seconds in
``validity.csv`` and ``validity.json`` add up the parts of a resumed run (``OUT/task_seconds.json``, :class:`_TaskClock`).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
from probeselect.confirm import CLAIMS  # noqa: E402
from probeselect.errors import CurriculumError, ProbeselectError  # noqa: E402

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


def _run_cfg(config: Path, out: Path, seed: int, tiny: bool, curriculum: str | None = None) -> tuple[list[str], dict]:
    """Overrides for ``probeselect run`` and the resolved config (``curriculum``: the toy ladder's
    curriculum, a built-in name or a YAML path; None = the config's own, by default planted)."""
    from probeselect.run import load_run_config

    ov = [f"out={out}", f"ladder.toy.seed={seed}"] + ([f"ladder.toy.curriculum={curriculum}"] if curriculum else [])
    raw = load_yaml(config)
    # the validation schedules its own worker processes (--jobs): a pipeline inside one trains its
    # bases one at a time (pilot/confirm `jobs` changes no number, only how many processes run)
    ov += [f"{k}.jobs=1" for k in ("pilot", "confirm", "replicate") if raw.get(k) is not None]
    # the pipeline measured here confirms the top N only: with `confirm.references` (the demos retrain the
    # naive choices at confirmation, for the report) its pick could be the latest checkpoint whenever that wins
    # the confirmation, so "pipeline" would partly be the "latest" selector it is compared with. A plan with
    # `selection.decision.against: latest` is the exception that confirm() makes itself: it claims "better than
    # the latest", so the latest is retrained at the confirmation budget to test that claim there
    ov += ["confirm.references=[]"] if raw.get("confirm") else []
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


def _rank(pilot_dir: Path, spec, bases: list[str] | None = None, default: str | None = None):
    """The ranking of a pilot folder; ``default``: the plan's ``decision.against`` base (the pipeline's and the
    probe-free pilot's rule; the truth is ranked without it: its verdicts are clear winners only)."""
    from probeselect.select import load_pilot_tables, rank_bases

    return rank_bases(load_pilot_tables(pilot_dir), spec, bases=bases, default=default)


#: Verdicts that make a pick decisive: a clear winner, or (plans with ``selection.decision.against``)
#: a base shown better than the default with its equivalents named -- the verdicts that claim a
#: comparison, one definition with the confirmation's (:data:`probeselect.confirm.CLAIMS`).
DECISIVE = CLAIMS


def _pilot(bases, recipe: str, out: Path, overrides: list[str], seeds: list[int] | None, device: str,
           extra: list[str] = ()) -> None:
    from probeselect.pilot import run_pilot

    ov = list(overrides) + list(extra) + ([f"seeds={json.dumps(seeds)}"] if seeds is not None else [])
    run_pilot(bases, recipe, out, progress=False, device=device, overrides=ov, jobs=1)  # workers are ours


# ---------------------------------------------------------------------------
# Stages. Each runs in a worker process (single-threaded torch) or in the main process
# (``jobs=1``); the scheduler in :func:`validate` runs them as soon as their inputs exist, so
# ``jobs`` workers stay busy: a seed's pipeline, then one ground-truth task per checkpoint, then
# its two planted ties, then its row (cheap, in the main process).
# ---------------------------------------------------------------------------


#: Toy seeds used while developing the curriculum (v1-v6), the plan and the recipes: not a held-out test.
DEV_SEEDS = [0, 1, 2, 3, 4]
#: Default validation seeds: fresh, never used for tuning.
FRESH_SEEDS = [5, 6, 7, 8, 9]
#: First SFT seed of the ground truth: the truth's SFT seeds are TRUTH_SEED_START .. + truth_seeds - 1,
#: disjoint from every pilot and confirmation seed (the recipes use 0-2), so the truth shares no data
#: order or LoRA init with the runs it judges.
TRUTH_SEED_START = 100
#: Random stream of the truth's transfer items (toy.data.make_transfer_rows); the pilot's is "transfer".
TRUTH_STREAM = "transfer-truth"
#: Relative size of the independent weight perturbation of each perturbed twin (x each tensor's sd).
TWIN_NOISE = 0.01
#: Selectors compared on the same truth (see the module docstring), in table order.
SELECTORS = ("pipeline", "latest", "lowest_bpb", "best_capability", "probes_only", "probe_free_pilot",
             "random_k_pilot", "random_eligible")


def _settings(config: Path, tiny: bool, truth_seeds: int, truth_seed_start: int = TRUTH_SEED_START,
              twin_noise: float = TWIN_NOISE, curriculum: str | None = None) -> dict:
    return {"config": Path(config), "tiny": bool(tiny), "truth_seeds": list(range(truth_seed_start,
                                                                                   truth_seed_start + truth_seeds)),
            "twin_noise": float(twin_noise), "curriculum": curriculum}


def _cfg(st: dict, out_root: Path, seed: int) -> dict:
    return _run_cfg(st["config"], out_root / f"seed{seed}", seed, st["tiny"], st.get("curriculum"))[1]


def _stage_pipeline(seed: int, out_root: Path, st: dict) -> dict:
    """``probeselect run CONFIG`` for one seed; returns its ladder's checkpoint names and the seconds."""
    from probeselect.checkpoints import discover_checkpoints
    from probeselect.run import run_pipeline

    out = out_root / f"seed{seed}"
    ov, cfg = _run_cfg(st["config"], out, seed, st["tiny"], st.get("curriculum"))
    t0 = time.perf_counter()
    run_pipeline(st["config"], overrides=ov, progress=False, log=lambda m: None)
    return {"checkpoints": [c.name for c in discover_checkpoints(Path(cfg["_paths"]["ladder"]))],
            "seconds": time.perf_counter() - t0}


def _truth_suite_path(out_root: Path, seed: int) -> Path:
    return out_root / f"seed{seed}" / "truth" / "truth_transfer.jsonl"


def _write_truth_suite(seed: int, out_root: Path, st: dict) -> dict:
    """The truth's transfer suite: the toy transfer kinds and sizes of the pilot's suite, drawn from
    their own random stream (:data:`TRUTH_STREAM`) with every pilot prompt excluded; ids prefixed
    ``truth-``. Refuses a suite that shares a prompt with the pilot's, or whose kind counts differ.
    Returns facts for validity.json (sizes, shared prompts, probe-template hits of both suites)."""
    from probeselect.toy.data import make_transfer_rows, read_jsonl
    from probeselect.toy.world import ToyWorld
    from probeselect.transfer import probe_template_matches

    cfg = _cfg(st, out_root, seed)
    data = Path(cfg["_paths"]["ladder"]) / "data"
    pilot = read_jsonl(data / "transfer.jsonl")
    sft = {r["prompt"] for r in read_jsonl(data / "sft.jsonl")}
    kinds = tuple(dict.fromkeys(r["kind"] for r in pilot))
    world = ToyWorld.generate(seed)
    truth = make_transfer_rows(world, sft, stream=TRUTH_STREAM, exclude_prompts={r["prompt"] for r in pilot},
                               kinds=kinds)
    count = lambda rows: {k: sum(r["kind"] == k for r in rows) for k in kinds}  # noqa: E731
    shared = {r["prompt"] for r in pilot} & {r["prompt"] for r in truth}
    if shared or count(truth) != count(pilot):
        raise RuntimeError(f"{data / 'transfer.jsonl'}: the truth suite of seed {seed} is not a disjoint draw of the "
                           f"same kinds and sizes (shared prompts {len(shared)}; counts {count(truth)} vs "
                           f"{count(pilot)}). Was the ladder built by another version of probeselect.toy.data? "
                           "Rebuild it (delete the seed folder).")
    for r in truth:
        r["id"] = "truth-" + r["id"]
    path = _truth_suite_path(out_root, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in truth))
    return {"pilot_items": len(pilot), "truth_items": len(truth), "shared_prompts": len(shared),
            "kinds": count(truth), "probe_template_hits_pilot": len(probe_template_matches(pilot)),
            "probe_template_hits_truth": len(probe_template_matches(truth))}


#: What the ground truth switches off in the confirmation recipe: the robustness items and the held-out SFT
#: loss (it judges transfer on its own suite only). Also used by bench/late_harm_truth.py and bench/truth_time.py.
TRUTH_OFF = ["transfer.robustness=null", "transfer.heldout=null", "eval.every=0"]


def _truth_extra(st: dict, suite: Path) -> list[str]:
    return (TRUTH_OFF
            + (TINY_RECIPE if st["tiny"] else []) + [f"transfer.tasks={suite}"])


def _stage_truth(seed: int, out_root: Path, st: dict, base: str, parts: str) -> float:
    """Ground truth for one base (a checkpoint folder of the ladder or a perturbed twin): the
    confirmation recipe under the truth's SFT seeds on the truth's own transfer suite, into
    ``OUT/seed<S>/<parts>/parts/<name>`` (merged by :func:`_merge_truth`). Returns the seconds."""
    out = out_root / f"seed{seed}"
    cfg = _cfg(st, out_root, seed)
    conf_cfg = cfg.get("confirm") or cfg["pilot"]
    t0 = time.perf_counter()
    _pilot([Path(base)], conf_cfg["recipe"], out / parts / "parts" / Path(base).name,
           list(conf_cfg.get("overrides") or []), st["truth_seeds"], str(cfg.get("device", "auto")),
           extra=_truth_extra(st, _truth_suite_path(out_root, seed)))
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


def _make_twins(seed: int, out_root: Path, st: dict) -> list[str]:
    """Two perturbed twins of the ladder's last checkpoint: each a copy whose every weight tensor
    gets independent Gaussian noise of sd ``twin_noise`` x that tensor's sd (torch generator seeded
    by the toy seed and the copy). The two copies are exchangeable -- equal in expectation by
    construction -- but not identical, so the pilot can call a false winner between them; the truth
    (same SFT seeds as for the checkpoints) checks that it cannot separate them."""
    import torch
    from safetensors.torch import load_file, save_file

    from probeselect.checkpoints import discover_checkpoints

    cfg = _cfg(st, out_root, seed)
    src = [c for c in discover_checkpoints(Path(cfg["_paths"]["ladder"])) if c.step is not None][-1]
    paths = []
    for j, tag in enumerate(("a", "b")):
        dst = out_root / f"seed{seed}" / "ties" / "twin" / "bases" / f"{src.name}-perturbed-{tag}"
        paths.append(str(dst))
        if (dst / "twin.json").is_file():
            continue
        shutil.rmtree(dst, ignore_errors=True)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src.path, dst)
        files = sorted(dst.glob("*.safetensors"))
        if not files:
            raise RuntimeError(f"{src.path}: no *.safetensors weights to perturb for the twin tie.")
        g = torch.Generator().manual_seed(1_000_003 * seed + j + 1)
        for f in files:
            w = load_file(str(f))
            for k in sorted(w):
                t = w[k]
                if t.is_floating_point() and t.numel() > 1:
                    sd = t.float().std()
                    w[k] = (t.float() + st["twin_noise"] * sd * torch.randn(t.shape, generator=g)).to(t.dtype)
            save_file(w, str(f), metadata={"format": "pt"})
        atomic_write_json(dst / "twin.json", {"source": str(src.path), "noise": st["twin_noise"],
                                              "generator_seed": 1_000_003 * seed + j + 1})
    return paths


def _tie_bases(seed: int, out_root: Path, st: dict) -> list[tuple[str, list[str], bool]]:
    """The two planted ties of a seed (name, base paths, whether the truth itself calls it a tie):
    ``twin`` (the perturbed twins; the twins' own truth runs must not separate them) and
    ``same_mode`` (the last two checkpoints; counted only when the truth does not separate them)."""
    from probeselect.checkpoints import discover_checkpoints

    out = out_root / f"seed{seed}"
    cfg = _cfg(st, out_root, seed)
    spec_truth = _truth_spec(_spec(cfg))
    twins = _make_twins(seed, out_root, st)
    twin_truth = _rank(out / "ties" / "twin" / "truth", spec_truth, [Path(t).name for t in twins])
    last2 = [c for c in discover_checkpoints(Path(cfg["_paths"]["ladder"])) if c.step is not None][-2:]
    return [("twin", twins, twin_truth.verdict != "winner"),
            ("same_mode", [str(c.path) for c in last2],
             _rank(out / "truth", spec_truth, [c.name for c in last2]).verdict != "winner")]


def _stage_tie(seed: int, out_root: Path, st: dict, name: str, bases: list[str]) -> float:
    """Pilot one planted tie at the pilot budget (pilot recipe and seeds of CONFIG)."""
    out = out_root / f"seed{seed}"
    cfg = _cfg(st, out_root, seed)
    t0 = time.perf_counter()
    pilot_cfg = cfg["pilot"]
    _pilot(bases, pilot_cfg["recipe"], out / "ties" / name / "pilot", list(pilot_cfg.get("overrides") or []), None,
           str(cfg.get("device", "auto")), extra=TINY_RECIPE if st["tiny"] else [])
    return time.perf_counter() - t0


def probe_free_bases(checkpoints: list[tuple[str, int | None]], windows: dict, k: int) -> list[str]:
    """The probe-free pilot's bases: the last checkpoint of each data window (``windows``: name ->
    window, from data_lineage.json), in ladder order; without a lineage, ``k`` evenly spaced
    checkpoints ending at the last one. ``checkpoints``: (name, step) in ladder order."""
    named = [n for n, s in checkpoints if s is not None] or [n for n, _ in checkpoints]
    if windows:
        last: dict[str, str] = {}
        for n in named:
            if n in windows:
                last[windows[n]] = n
        return [n for n in named if n in set(last.values())]
    k = max(1, min(k, len(named)))
    idx = sorted({int(round(x)) for x in np.linspace(len(named) - 1, 0, k)} if k > 1 else {len(named) - 1})
    return [named[i] for i in idx]


def _probe_free_list(seed: int, out_root: Path, st: dict) -> list[str]:
    from probeselect.checkpoints import discover_checkpoints
    from probeselect.plan import load_selection_plan

    cfg = _cfg(st, out_root, seed)
    ladder = Path(cfg["_paths"]["ladder"])
    ck = discover_checkpoints(ladder)
    names = probe_free_bases([(c.name, c.step) for c in ck], _windows_of(ladder),
                             int(load_selection_plan(cfg["plan"]).shortlist.k))
    return [str(c.path) for c in ck if c.name in names]


def _stage_probe_free(seed: int, out_root: Path, st: dict) -> float:
    """The probe-free pilot: the pipeline's pilot recipe, overrides and seeds (same budget) on
    :func:`probe_free_bases`, with the same leakage guard (the pipeline's probe items)."""
    out = out_root / f"seed{seed}"
    cfg = _cfg(st, out_root, seed)
    pilot_cfg = cfg["pilot"]
    t0 = time.perf_counter()
    items = Path(cfg["_paths"]["run"]) / "items.jsonl"
    extra = (TINY_RECIPE if st["tiny"] else []) + ([f"transfer.probe_items={json.dumps([str(items)])}"]
                                                   if items.is_file() else [])
    _pilot(_probe_free_list(seed, out_root, st), pilot_cfg["recipe"], out / "probe_free" / "pilot",
           list(pilot_cfg.get("overrides") or []), None, str(cfg.get("device", "auto")), extra=extra)
    return time.perf_counter() - t0


def _truth_spec(spec):
    """The plan's selection spec for the truth: without the ``robust_recovery`` floor (the truth
    runs skip the robustness items)."""
    if any(c.metric in ("robust_recovery",) for c in getattr(spec, "constraints", ())):
        import dataclasses

        return dataclasses.replace(spec, constraints=tuple(c for c in spec.constraints
                                                           if c.metric != "robust_recovery"))
    return spec


# ---------------------------------------------------------------------------
# Metrics on the truth table (pure functions of per-seed truth values; tested on hand-made tables)
# ---------------------------------------------------------------------------


def pair_interval(best: np.ndarray, pick: np.ndarray, level: float = 0.95) -> tuple[float, float, float]:
    """Paired t interval of mean(best - pick) over the truth's SFT seeds (values oriented so that
    higher = better): (mean, low, high); low = high = NaN with fewer than 2 seeds; (0, 0, 0) when
    the two are the same base."""
    from scipy.stats import t as student_t

    d = np.asarray(best, float) - np.asarray(pick, float)
    n = len(d)
    if n < 2:
        return float(d.mean()) if n else float("nan"), float("nan"), float("nan")
    half = float(student_t.ppf(0.5 + level / 2, n - 1) * d.std(ddof=1) / np.sqrt(n))
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def pick_metrics(per_seed: pd.DataFrame, best: str, pick: str, *, margin: float, min_seeds: int,
                 level: float = 0.95) -> dict:
    """How good a pick is on the truth. ``per_seed``: rows = bases, columns = truth SFT seeds
    (oriented: higher = better). ``regret`` = mean(best - pick) with its paired-t interval
    (``regret_lo``/``regret_hi``); ``agree`` (lenient, the plan's rule on the truth): the pick is
    truth's best or the truth cannot separate them (not: n >= min_seeds and low > margin);
    ``agree_strict``: pick == best; ``equiv_agree``: the pick is truth's best or the truth shows them
    equivalent (the upper end of the interval of best - pick is below the tie margin)."""
    if pick == best:
        return {"regret": 0.0, "regret_lo": 0.0, "regret_hi": 0.0, "agree": True, "agree_strict": True,
                "equiv_agree": True}
    m, lo, hi = pair_interval(per_seed.loc[best].to_numpy(float), per_seed.loc[pick].to_numpy(float), level)
    n = per_seed.shape[1]
    separated = n >= min_seeds and lo == lo and lo > margin
    return {"regret": m, "regret_lo": lo, "regret_hi": hi, "agree": not separated, "agree_strict": False,
            "equiv_agree": bool(hi == hi and hi < margin)}


def expected_metrics(per_seed: pd.DataFrame, best: str, picks_with_weights: list[tuple[str, float]], **kw) -> dict:
    """Expected metrics of a randomised selector: the weighted mean of :func:`pick_metrics` over its
    possible picks (weights sum to 1); no interval (``regret_lo``/``regret_hi`` NaN)."""
    rows = [(pick_metrics(per_seed, best, p, **kw), w) for p, w in picks_with_weights]
    out = {k: float(sum(w * float(r[k]) for r, w in rows)) for k in ("regret", "agree", "agree_strict", "equiv_agree")}
    return {**out, "regret_lo": float("nan"), "regret_hi": float("nan")}


def random_k_pilot_picks(values: pd.Series, pool: list[str], k: int) -> list[tuple[str, float]]:
    """random k + pilot, computed from the truth without training: every k-subset of ``pool`` is
    equally likely and the pilot is assumed to pick the subset's truth-best base (an oracle pilot:
    favourable to this baseline). Returns (pick, probability) pairs. ``values`` oriented higher =
    better; exact ties in a subset split evenly."""
    from itertools import combinations

    pool = list(pool)
    k = max(1, min(k, len(pool)))
    subsets = list(combinations(pool, k))
    w: dict[str, float] = {}
    for sub in subsets:
        top = max(values[b] for b in sub)
        winners = [b for b in sub if values[b] == top]
        for b in winners:
            w[b] = w.get(b, 0.0) + 1.0 / len(winners) / len(subsets)
    return sorted(w.items())


def clopper_pearson(x: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of x successes in n trials ((0, 1) when n = 0)."""
    from scipy.stats import beta

    if n == 0:
        return 0.0, 1.0
    a = 1 - level
    lo = 0.0 if x == 0 else float(beta.ppf(a / 2, x, n - x + 1))
    hi = 1.0 if x == n else float(beta.ppf(1 - a / 2, x + 1, n - x))
    return lo, hi


def mean_interval(x, level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``x`` over validation seeds with its t interval (NaN bounds with < 2 values)."""
    from scipy.stats import t as student_t

    x = np.asarray([v for v in x if v == v], float)
    if len(x) < 2:
        return (float(x.mean()) if len(x) else float("nan")), float("nan"), float("nan")
    half = float(student_t.ppf(0.5 + level / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def naive_picks(steps: dict, bpb: pd.Series, capability: pd.Series, shortlisted: list[str]) -> dict:
    """The picks of the probe-free naive selectors and of the probes alone: ``latest`` (highest
    step), ``lowest_bpb`` (lowest pretraining held-out bits per byte), ``best_capability``
    (highest plain-capability score), ``probes_only`` (shortlist rank 1). None where the input is
    missing. ``steps``: checkpoint -> step (None for unnumbered ones)."""
    stepped = {b: s for b, s in steps.items() if s is not None}
    bpb, capability = bpb.dropna(), capability.dropna()
    return {"latest": max(stepped, key=stepped.get) if stepped else None,
            "lowest_bpb": str(bpb.idxmin()) if len(bpb) else None,
            "best_capability": str(capability.idxmax()) if len(capability) else None,
            "probes_only": str(shortlisted[0]) if shortlisted else None}


def selector_rows(per_seed: pd.DataFrame, best: str, picks: dict, pool: list[str], k: int, **kw) -> list[dict]:
    """One row per selector of :data:`SELECTORS` on the same truth. ``picks``: selector -> (pick,
    decisive) for the deterministic selectors; ``random_k_pilot`` and ``random_eligible`` are
    expected values over ``pool`` (the plan-eligible checkpoints) computed from the truth.
    ``decisive_correct``: a decisive pick whose equivalence to truth's best the truth shows
    (:func:`pick_metrics`' ``equiv_agree``); for the random selectors its expectation."""
    val = per_seed.mean(axis=1)
    rows = []
    nan = {k_: float("nan") for k_ in ("regret", "regret_lo", "regret_hi", "agree", "agree_strict", "equiv_agree")}
    for name in SELECTORS:
        if name == "random_k_pilot":
            m = expected_metrics(per_seed, best, random_k_pilot_picks(val, pool, k), **kw)
            rows.append({"selector": name, "pick": None, "decisive": True, **m, "decisive_correct": m["equiv_agree"]})
        elif name == "random_eligible":
            m = expected_metrics(per_seed, best, [(b, 1 / len(pool)) for b in pool], **kw)
            rows.append({"selector": name, "pick": None, "decisive": True, **m, "decisive_correct": m["equiv_agree"]})
        elif name in picks:
            p, dec = picks[name]
            m = pick_metrics(per_seed, best, p, **kw) if p in per_seed.index else dict(nan)
            rows.append({"selector": name, "pick": p, "decisive": bool(dec), **m,
                         "decisive_correct": bool(dec and m["equiv_agree"] is True)})
    # one type per column: 1.0 / 0.0 for a pick, the expectation for a random selector
    for r in rows:
        for c in ("agree", "agree_strict", "equiv_agree", "decisive_correct"):
            r[c] = float(r[c])
    return rows


def _capability_score(summary: pd.DataFrame) -> pd.Series:
    """Plain-capability score per checkpoint: the mean over capability families (summary.csv kind
    ``capability``) of the family's mean ``candidate_accuracy`` over its variants."""
    cap = summary[summary["kind"] == "capability"]
    return cap.groupby(["checkpoint", "family"])["candidate_accuracy"].mean().groupby("checkpoint").mean()


def _heldout_bpb(summary: pd.DataFrame) -> pd.Series:
    h = summary[summary["family"] == "heldout_nll"]
    return h.groupby("checkpoint")["bits_per_byte"].mean()


def pipeline_pick(sel: dict, conf: dict | None) -> tuple[str | None, bool]:
    """The pipeline's pick and whether it is decisive (module docstring, ``pipeline``): after a confirmation, its
    top, decisive when it names a clear winner or a base better than the default and the pilot's decision held,
    or when the pilot's ``beats_default`` claim held against the default alone ("default_beaten": the report's
    recommendation), or when a claim only the confirmation made held on fresh seeds ("replicated", ``conf`` with
    ``replicate.json`` attached: :func:`probeselect.final_report.attach_replication`); without one, the pilot's
    recommendation (else its top), decisive on a claim."""
    from probeselect.final_report import confirmation_status

    pilot_dec = sel["decision"]
    if not conf:
        return pilot_dec.get("recommended") or pilot_dec.get("top"), pilot_dec.get("verdict") in DECISIVE
    cd = conf.get("confirm_decision") or {}
    cs = confirmation_status(sel, conf)
    if cs.status in ("default_beaten", "replicated"):
        return cs.recommended, True
    pick = cd.get("top") or cd.get("recommended") or pilot_dec.get("recommended") or pilot_dec.get("top")
    return pick, cd.get("verdict") in DECISIVE and bool(conf.get("held", True))


def _seed_row(seed: int, out_root: Path, st: dict, ties_spec, secs: dict, facts: dict
              ) -> tuple[dict, list[dict], list[dict]]:
    """The validity row, selector rows and tie rows of a seed whose stages are all on disk."""
    from probeselect.checkpoints import discover_checkpoints

    out = out_root / f"seed{seed}"
    cfg = _cfg(st, out_root, seed)
    run_dir = Path(cfg["_paths"]["run"])
    ladder = Path(cfg["_paths"]["ladder"])
    spec = _spec(cfg)
    sel = json.loads((run_dir / "selection.json").read_text(encoding="utf-8"))
    conf = json.loads((run_dir / "confirm.json").read_text(encoding="utf-8")) if (run_dir / "confirm.json").is_file() \
        else None
    from probeselect.final_report import attach_replication

    conf = attach_replication(run_dir, conf, strict=True)  # replicate.json (a claim only the confirmation made, re-tested)
    pilot_dec = sel["decision"]
    ckpts = [c for c in discover_checkpoints(ladder)]
    windows = _windows_of(ladder)
    sign = 1.0 if spec.direction == "higher" else -1.0

    spec_truth = _truth_spec(spec)
    truth = _rank(out / "truth", spec_truth)
    tt = truth.table.set_index("base")
    scols = [c for c in tt.columns if c.startswith("seed") and c[4:].isdigit()]
    per_seed = sign * tt[scols].astype(float)                      # oriented: higher = better
    val = sign * tt["value"].astype(float)
    truth_best_all = str(val.idxmax())                            # best over all checkpoints
    truth_best = truth.top or truth_best_all                      # best under the plan's selection constraints
    sl = pd.read_csv(run_dir / "shortlist.csv")
    sl["checkpoint"] = sl["checkpoint"].astype(str)
    plan_ok = set(sl.loc[sl["passes_constraints"].astype(bool), "checkpoint"]) & set(tt.index)
    elig_truth = set(tt.index[tt["eligible"].astype(bool)])
    pool = ([b for b in tt.index if b in plan_ok and b in elig_truth] or [b for b in tt.index if b in elig_truth]
            or list(tt.index))
    truth_best_plan = max(pool, key=lambda b: val[b]) if pool else None
    kw = {"margin": float(spec.tie_margin), "min_seeds": int(spec.min_sft_seeds), "level": float(spec.level)}

    # --- the picks ---
    cd = (conf or {}).get("confirm_decision") or {}
    pipe_pick, decided = pipeline_pick(sel, conf)
    summary = pd.read_csv(run_dir / "summary.csv")
    bpb = _heldout_bpb(summary).reindex(tt.index)
    capab = _capability_score(summary).reindex(tt.index)
    shortlisted = json.loads((run_dir / "shortlist.json").read_text(encoding="utf-8"))["selected"]
    from probeselect.select import default_base

    pf = _rank(out / "probe_free" / "pilot", spec, default=default_base(run_dir, spec))
    naive = naive_picks({c.name: c.step for c in ckpts if c.name in tt.index}, bpb, capab,
                        [str(x["checkpoint"]) for x in shortlisted])
    picks = {"pipeline": (pipe_pick, bool(decided)), **{n: (p, True) for n, p in naive.items()},
             "probe_free_pilot": (pf.recommended or pf.top, pf.verdict in DECISIVE)}
    k = int(len(shortlisted) or 3)
    notes = {"pipeline": f"confirmation: {cd.get('verdict', pilot_dec.get('verdict'))}", "latest": "last checkpoint",
             "lowest_bpb": "lowest pretraining held-out bpb", "best_capability": "highest mean capability candidate_accuracy",
             "probes_only": "shortlist rank 1",
             "probe_free_pilot": f"pilot of {' '.join(str(b) for b in pf.table['base'])}: {pf.verdict}",
             "random_k_pilot": f"expected over all {k}-subsets of the {len(pool)} plan-eligible checkpoints, oracle pilot",
             "random_eligible": f"expected over the {len(pool)} plan-eligible checkpoints"}
    sel_rows = [{"seed": seed, **r, "pick_window": windows.get(r["pick"], "") if r["pick"] else "",
                 "note": notes[r["selector"]]} for r in selector_rows(per_seed, truth_best, picks, pool, k, **kw)]

    # --- Kendall tau against the truth ---
    agg_col = next(c for c in ("mean_rank", "median_rank") if c in sl.columns)
    sla = sl[sl[agg_col].notna() & sl["checkpoint"].isin(tt.index)]
    tau_probe = _kendall_tau_b(-sla[agg_col].to_numpy(float), val.reindex(sla["checkpoint"]).to_numpy())
    steps = {c.name: c.step for c in ckpts}
    stepped = [b for b in tt.index if steps.get(b) is not None]
    tau_step = _kendall_tau_b(np.array([steps[b] for b in stepped], float), val.reindex(stepped).to_numpy())
    hb = bpb.dropna()
    tau_bpb = _kendall_tau_b(-hb.to_numpy(float), val.reindex(hb.index).to_numpy())

    # --- ties ---
    ties = []
    for name, bases, truth_tie in ties_spec:
        rk = _rank(out / "ties" / name / "pilot", spec)
        ties.append({"seed": seed, "tie": name, "bases": " vs ".join(Path(b).name for b in bases),
                     "truth_is_tie": bool(truth_tie), "verdict": rk.verdict, "diff": rk.diff,
                     "diff_ci_low": rk.diff_ci[0] if rk.diff_ci else None,
                     "diff_ci_high": rk.diff_ci[1] if rk.diff_ci else None,
                     "false_clear_winner": bool(truth_tie and rk.verdict == "winner")})

    short_names = {str(x["checkpoint"]) for x in shortlisted}
    truth_rows = [{"seed": seed, "checkpoint": b, "window": windows.get(b, ""), "truth_value": float(tt.loc[b, "value"]),
                   "truth_seed_sd": float(np.std(tt.loc[b, scols].to_numpy(float), ddof=1)) if len(scols) > 1
                   else float("nan"), "eligible": bool(tt.loc[b, "eligible"]), "plan_eligible": b in plan_ok,
                   "shortlisted": b in short_names, "pick": b == pipe_pick,
                   "heldout_bpb": float(bpb.get(b, np.nan)), "capability": float(capab.get(b, np.nan))}
                  for b in tt.index]
    atomic_write_csv(out / "truth_values.csv", pd.DataFrame(truth_rows).sort_values("checkpoint", key=lambda c: c.map(
        lambda n: int(n.rsplit("-", 1)[-1]) if n.rsplit("-", 1)[-1].isdigit() else 0)))
    pm = next(r for r in sel_rows if r["selector"] == "pipeline")
    lm = next(r for r in sel_rows if r["selector"] == "latest")
    row = {"seed": seed, **_dip_columns(run_dir, ladder), "pick": pipe_pick, "pick_window": windows.get(pipe_pick, ""),
           "decided": bool(decided), "truth_best": truth_best, "truth_best_all": truth_best_all,
           "truth_best_plan_eligible": truth_best_plan,
           "agree": pm["agree"], "agree_strict": pm["agree_strict"], "equiv_agree": pm["equiv_agree"],
           "decisive_correct": pm["decisive_correct"], "regret": pm["regret"], "regret_lo": pm["regret_lo"],
           "regret_hi": pm["regret_hi"], "latest": lm["pick"], "latest_agree": lm["agree"],
           "latest_equiv_agree": lm["equiv_agree"], "latest_regret": lm["regret"],
           "tau_probes": tau_probe, "tau_step": tau_step, "tau_neg_bpb": tau_bpb, "n_ranked": int(len(sla)),
           "shortlist": " ".join(f"{x['checkpoint']}({windows.get(str(x['checkpoint']), '?')})" for x in shortlisted),
           "probe_free_bases": " ".join(str(b) for b in pf.table["base"]),
           "decision": pilot_dec.get("verdict"), "confirmation": (conf or {}).get("statement") or "",
           "truth_verdict": truth.verdict, "truth_seeds": " ".join(str(s) for s in st["truth_seeds"]),
           **{f"seconds_{k}": round(v, 1) for k, v in secs.items()}}
    return row, sel_rows, ties


def _summaries(sel: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """One row per selector over the validation seeds: regret mean (t interval over seeds) and max,
    and the share of seeds with each agreement (expected values for the random selectors)."""
    rows = []
    for name in SELECTORS:
        g = sel[sel["selector"] == name]
        if g.empty:
            continue
        m, lo, hi = mean_interval(g["regret"].astype(float), level)
        rows.append({"selector": name, "n_seeds": len(g), "regret_mean": m, "regret_mean_lo": lo, "regret_mean_hi": hi,
                     "regret_max": float(g["regret"].astype(float).max()),
                     "agree": float(g["agree"].astype(float).sum()), "agree_strict": float(g["agree_strict"].astype(float).sum()),
                     "equiv_agree": float(g["equiv_agree"].astype(float).sum()),
                     "decisive": float(g["decisive"].astype(float).sum()),
                     "decisive_correct": float(g["decisive_correct"].astype(float).sum())})
    return pd.DataFrame(rows)


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


class _TaskClock:
    """Seconds that survive a resume, in ``OUT/task_seconds.json``.

    A resumed validation skips what is done, so a finished task returns in a second and the wall clock of the
    last part is all that :func:`time.perf_counter` sees. This keeps, per task (``"<seed>/<kind>[/<what>]"``),
    the seconds of every part that finished it, added up, and per part of the run (``parts``: its start and
    its wall seconds so far, updated at every finished task). A task stopped mid-run loses the seconds of the
    part that was stopped (its own checkpoints resume its work, not its clock), so totals are lower bounds
    for a run that was stopped."""

    def __init__(self, out: Path):
        self.path = Path(out) / "task_seconds.json"
        try:
            state = json.loads(self.path.read_text()) if self.path.is_file() else {}
        except ValueError:
            state = None
        if state is None or (state and not (isinstance(state, dict) and isinstance(state.get("tasks"), dict)
                                            and isinstance(state.get("parts"), list))):
            raise RuntimeError(f"{self.path}: not a task-seconds file of bench/validity.py (keys 'tasks' and "
                               "'parts'); delete it to start the clock afresh.")
        self.tasks: dict[str, float] = dict(state.get("tasks", {}))
        self.parts: list[dict] = list(state.get("parts", []))
        self.parts.append({"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": 0.0})
        self._t0 = time.perf_counter()

    def add(self, seed: int, kind: str, what, took: float) -> float:
        """Add this part's ``took`` to the task's total; returns the total over all parts."""
        key = f"{seed}/{kind}" + (f"/{what}" if what else "")
        self.tasks[key] = round(self.tasks.get(key, 0.0) + float(took), 1)
        self.tick()
        return self.tasks[key]

    def tick(self) -> None:
        self.parts[-1]["seconds"] = round(time.perf_counter() - self._t0, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, {"tasks": self.tasks, "parts": self.parts})

    @property
    def wall(self) -> float:
        """The wall seconds of every part, added up (this one up to the last :meth:`tick`)."""
        return round(sum(p["seconds"] for p in self.parts), 1)


class _Inline:
    """An executor that runs each task at submission, in this process (``jobs=1``)."""

    def submit(self, fn, *args):
        from concurrent.futures import Future

        f: Future = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - re-raised by f.result()
            f.set_exception(e)
        return f

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _schedule(seeds, out: Path, st: dict, jobs: int, log, keep, clock: _TaskClock | None = None) -> None:
    """Run every stage of every seed, each as soon as its inputs exist: a seed's pipeline; then
    (main process) its truth suite and perturbed twins, and one truth task per checkpoint and per
    twin plus the probe-free pilot; then its two tie pilots; then its row. ``jobs > 1``: on ``jobs``
    single-threaded worker processes (tasks are minutes long, so the workers stay busy);
    ``jobs = 1``: in this process, one after the other (same results). Every finished task is
    logged with its seconds and the wall time so far. ``clock`` (default: a fresh :class:`_TaskClock` on
    ``out``) adds each task's seconds to those of earlier parts of a resumed run."""
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    t_start = time.perf_counter()
    clock = clock or _TaskClock(out)
    secs = {s: {"pipeline": 0.0, "truth": 0.0, "probe_free": 0.0, "ties": 0.0} for s in seeds}
    left: dict[int, set] = {}
    ckpts_of: dict[int, list] = {}
    twins_of: dict[int, list] = {}
    ties_of: dict[int, list] = {}
    facts: dict[int, dict] = {}
    phase: dict[int, str] = {}
    if jobs > 1:
        os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the spawned workers
        ex_cm = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_init_worker)
    else:
        ex_cm = _Inline()
    with ex_cm as ex:
        pending = {}

        def submit(key, fn, *args):
            pending[ex.submit(fn, *args)] = key

        for s in seeds:
            log(f"[seed {s}] pipeline: probeselect run {st['config']} out={out / f'seed{s}'} ladder.toy.seed={s}")
            submit(("pipeline", s, None), _stage_pipeline, s, out, st)
        while pending:
            done = [f for f in pending if f.done()] or list(wait(pending, return_when=FIRST_COMPLETED)[0])
            for f in sorted(done, key=lambda f: (pending[f][1], pending[f][0], str(pending[f][2]))):
                kind, s, what = pending.pop(f)
                res = f.result()  # a failed stage stops the validation with its own error
                part = res["seconds"] if kind == "pipeline" else res
                took = clock.add(s, kind, what, part)  # this part's seconds plus earlier parts'
                log(f"[seed {s}] done {kind}{' ' + str(what) if what else ''}: {part:.0f} s"
                    f"{f' ({took:.0f} s over all parts)' if took > part + 0.5 else ''} "
                    f"(wall {time.perf_counter() - t_start:.0f} s)")
                if kind == "pipeline":
                    secs[s]["pipeline"] = took
                    ckpts_of[s] = list(res["checkpoints"])
                    facts[s] = _write_truth_suite(s, out, st)
                    twins_of[s] = _make_twins(s, out, st)
                    ladder = Path(_cfg(st, out, s)["_paths"]["ladder"])
                    log(f"[seed {s}] truth: {len(ckpts_of[s])} checkpoints + 2 perturbed twins x SFT seeds "
                        f"{st['truth_seeds']}; probe-free pilot")
                    left[s] = set()
                    for c in ckpts_of[s]:
                        left[s].add(("truth", c))
                        submit(("truth", s, c), _stage_truth, s, out, st, str(ladder / c), "truth")
                    for t in twins_of[s]:
                        left[s].add(("twin_truth", Path(t).name))
                        submit(("twin_truth", s, Path(t).name), _stage_truth, s, out, st, t, "ties/twin/truth")
                    left[s].add(("probe_free", None))
                    submit(("probe_free", s, None), _stage_probe_free, s, out, st)
                    phase[s] = "truth"
                    continue
                if kind in ("truth", "twin_truth"):
                    secs[s]["truth"] += took
                elif kind == "probe_free":
                    secs[s]["probe_free"] += took
                else:
                    secs[s]["ties"] += took
                left[s].discard((kind, what))
                if left[s]:
                    continue
                if phase[s] == "truth":
                    _merge_truth(out / f"seed{s}" / "truth", ckpts_of[s])
                    _merge_truth(out / f"seed{s}" / "ties" / "twin" / "truth", [Path(t).name for t in twins_of[s]])
                    ties_of[s] = _tie_bases(s, out, st)
                    phase[s] = "ties"
                    for name, bases, _tie in ties_of[s]:
                        left[s].add(("tie", name))
                        log(f"[seed {s}] tie {name}: {[Path(b).name for b in bases]}")
                        submit(("tie", s, name), _stage_tie, s, out, st, name, bases)
                else:
                    keep(*_seed_row(s, out, st, ties_of[s], secs[s], facts[s]), facts[s])
                    log(f"[seed {s}] row written (wall {time.perf_counter() - t_start:.0f} s)")


#: CPU-seconds per task, single-threaded, measured on the project's 2-core machine: pipeline per seed
#: (ladder build included; the last full run, 2026-12-02, bench/VALIDITY.md - before batched seeds and
#: the supervised-positions head, so now an over-estimate); one truth SFT run at the confirmation
#: budget (300 steps, 280 task items, no robustness/held-out) and one pilot run at the pilot budget
#: (150 steps, with robustness and held-out evaluation), both with the seeds of a base batched
#: (2026-12-03, 65d6ab3, bench/README.md: 92.5 s for 2 checkpoints x 4 truth seeds; 59.7-60.8 s for
#: the 9 runs of the demo pilot stage; they were 22.3 s and 11.5 s on 2026-12-02).
COST_PIPELINE_S, COST_TRUTH_RUN_S, COST_PILOT_RUN_S = 590.0, 11.6, 6.7


def budget_estimate(n_seeds: int, truth_seeds: int, jobs: int, *, n_checkpoints: int = 10, pilot_seeds: int = 3,
                    probe_free_bases: int = 3) -> dict:
    """Estimated CPU-seconds per seed and wall minutes (CPU / jobs, no tail) of a full validation."""
    per = {"pipeline": COST_PIPELINE_S,
           "truth": (n_checkpoints + 2) * truth_seeds * COST_TRUTH_RUN_S,
           "probe_free": probe_free_bases * pilot_seeds * COST_PILOT_RUN_S,
           "ties": 2 * 2 * pilot_seeds * COST_PILOT_RUN_S}
    per_seed = round(sum(per.values()))
    total = per_seed * n_seeds  # from the rounded per-seed figure, so that the printed numbers multiply
    return {"per_seed_cpu_s": {k: round(v) for k, v in per.items()}, "per_seed_total_cpu_s": per_seed,
            "total_cpu_s": total, "wall_min_estimate": round(total / max(1, jobs) / 60, 1), "jobs": jobs,
            "assumes": "costs measured 2026-12-02/03 on 2 cores (COST_* constants); the toy ladder's 10 checkpoints"}


def validate(seeds: list[int], out: Path, *, config: Path = ROOT / "recipes" / "demo.yaml", truth_seeds: int = 4,
             tiny: bool = False, log=print, jobs: int = 1, truth_seed_start: int = TRUTH_SEED_START,
             twin_noise: float = TWIN_NOISE, curriculum: str | None = None) -> dict:
    """Validate every seed; write validity.csv/.md, selectors.csv, selector_summary.csv, ties.csv,
    truth_values.csv and validity.json. ``jobs=1``: in this process; ``jobs>1``: every stage on
    ``jobs`` single-threaded worker processes (:func:`_schedule`; same results). ``curriculum``:
    the toy ladders' curriculum (``ladder.toy.curriculum=``; None = the config's own)."""
    out = Path(out)
    st = _settings(config, tiny, truth_seeds, truth_seed_start, twin_noise, curriculum)
    rows, sels, ties, facts = [], [], [], {}
    order = lambda r: seeds.index(r["seed"])  # noqa: E731

    def _keep(row, sel, tie, fact):
        rows.append(row)
        sels.extend(sel)
        ties.extend(tie)
        facts[str(row["seed"])] = fact  # JSON keys are strings
        rows.sort(key=order)
        atomic_write_csv(out / "validity.csv", pd.DataFrame(rows))
        atomic_write_csv(out / "selectors.csv", pd.DataFrame(sorted(sels, key=lambda r: (order(r), SELECTORS.index(r["selector"])))))
        atomic_write_csv(out / "ties.csv", pd.DataFrame(sorted(ties, key=lambda t: (order(t), t["tie"]))))

    clock = _TaskClock(out)
    _schedule(seeds, out, st, jobs, log, _keep, clock)
    df = pd.DataFrame(rows)
    sdf = pd.DataFrame(sorted(sels, key=lambda r: (order(r), SELECTORS.index(r["selector"]))))
    tdf = pd.DataFrame(sorted(ties, key=lambda t: (order(t), t["tie"])))
    summ = _summaries(sdf)
    atomic_write_csv(out / "selector_summary.csv", summ)
    tv = [out / f"seed{s}" / "truth_values.csv" for s in seeds]
    if all(p.is_file() for p in tv):
        atomic_write_csv(out / "truth_values.csv", pd.concat([pd.read_csv(p) for p in tv], ignore_index=True))
    counted = tdf[tdf["truth_is_tie"]]
    fw = int(counted["false_clear_winner"].sum())
    fw_ci = clopper_pearson(fw, len(counted))
    cfg0 = _cfg(st, out, seeds[0])
    pilot_seeds = _recipe_seeds(cfg0["pilot"])
    confirm_seeds = _recipe_seeds(cfg0.get("confirm") or cfg0["pilot"])
    rep_cfg = cfg0.get("replicate")
    replicate_seeds = ([] if rep_cfg is None else list(rep_cfg.get("seeds") or range(
        max(pilot_seeds + confirm_seeds) + 1, max(pilot_seeds + confirm_seeds) + 1 + len(confirm_seeds))))
    clock.tick()
    totals = {"seeds": seeds, "dev_seeds": DEV_SEEDS, "fresh": not (set(seeds) & set(DEV_SEEDS)),
              "truth_seeds": st["truth_seeds"], "pilot_seeds": pilot_seeds, "confirm_seeds": confirm_seeds,
              **({"replicate_seeds": replicate_seeds} if rep_cfg is not None else {}),
              "truth_stream": TRUTH_STREAM, "twin_noise": st["twin_noise"], "transfer_suites": facts,
              "agree": int(df["agree"].sum()), "agree_strict": int(df["agree_strict"].sum()),
              "equiv_agree": int(df["equiv_agree"].sum()), "decisive_correct": int(df["decisive_correct"].sum()),
              "latest_agree": int(df["latest_agree"].sum()),
              "dip_pass": int(df["dip_pass"].fillna(False).astype(bool).sum()), "n": len(df), "jobs": jobs,
              "false_clear_winners": fw, "ties_counted": len(counted), "false_winner_rate_ci95": list(fw_ci),
              "mean_tau_probes": float(df["tau_probes"].mean()), "mean_tau_step": float(df["tau_step"].mean()),
              "mean_tau_neg_bpb": float(df["tau_neg_bpb"].mean()),
              "selectors": summ.to_dict("records"),
              "seconds": clock.wall, "seconds_parts": clock.parts, "config": str(config), "tiny": tiny,
              "curriculum": curriculum}
    if set(pilot_seeds + confirm_seeds + replicate_seeds) & set(st["truth_seeds"]):
        raise RuntimeError(f"truth SFT seeds {st['truth_seeds']} overlap the pilot/confirmation/replication seeds "
                           f"{pilot_seeds} / {confirm_seeds} / {replicate_seeds}; pass another --truth-seed-start.")
    atomic_write_json(out / "validity.json", totals)
    atomic_write_text(out / "validity.md", _markdown(df) + "\n\n" + _markdown(sdf) + "\n\n" + _markdown(summ) + "\n\n"
                      + _markdown(tdf) + "\n\n"
                      + f"pipeline: agreement {totals['agree']}/{totals['n']} (lenient), strict {totals['agree_strict']}, "
                        f"equivalence {totals['equiv_agree']}, decisive and correct {totals['decisive_correct']}; "
                        f"'take the latest' agrees on {totals['latest_agree']}/{totals['n']}; false clear winners on "
                        f"ties {fw}/{len(counted)} (95% CI {fw_ci[0]:.2f}-{fw_ci[1]:.2f}); mean tau probes "
                        f"{totals['mean_tau_probes']:.2f}, step {totals['mean_tau_step']:.2f}, -bpb "
                        f"{totals['mean_tau_neg_bpb']:.2f}\n")
    return totals


def curriculum_dirname(curriculum: str) -> str:
    """The folder of a curriculum's validation under OUT: the built-in name, or a YAML file's stem."""
    p = Path(str(curriculum))
    return p.stem if p.suffix in (".yaml", ".yml") else str(curriculum)


def pooled_tables(per_curriculum: dict[str, pd.DataFrame], level: float = 0.95) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``per_curriculum``: curriculum -> its selectors.csv (one row per seed and selector). Returns
    (by_curriculum, pooled): the :func:`_summaries` table of every curriculum with a ``curriculum``
    column, and the same table over all curricula' seeds together (``n_seeds`` = seeds x curricula)."""
    by = []
    for name, sel in per_curriculum.items():
        by.append(_summaries(sel, level).assign(curriculum=name))
    by_df = pd.concat(by, ignore_index=True) if by else pd.DataFrame()
    if not by_df.empty:
        by_df = by_df[["curriculum"] + [c for c in by_df.columns if c != "curriculum"]]
    allsel = pd.concat([s.assign(curriculum=n) for n, s in per_curriculum.items()], ignore_index=True) \
        if per_curriculum else pd.DataFrame()
    return by_df, (_summaries(allsel, level) if not allsel.empty else pd.DataFrame())


def validate_curricula(curricula: list[str], seeds: list[int], out: Path, *, log=print, **kw) -> dict:
    """:func:`validate` once per curriculum into ``OUT/<curriculum>/`` (same seeds, settings and
    config; :func:`curriculum_dirname`), then one selector table per curriculum
    (``OUT/selector_summary_by_curriculum.csv``) and a pooled one over all of them
    (``OUT/selector_summary_pooled.csv``, ``OUT/selectors_pooled.csv``), Markdown in
    ``OUT/curricula.md`` and totals in ``OUT/curricula.json``."""
    out = Path(out)
    names = [curriculum_dirname(c) for c in curricula]
    if len(set(names)) != len(names):
        raise SystemExit(f"--curriculum: two curricula share the folder name ({names}); rename one YAML file.")
    totals, sels = {}, {}
    for c, name in zip(curricula, names):
        log(f"== curriculum {c} -> {out / name}")
        totals[name] = validate(seeds, out / name, log=log, curriculum=c, **kw)
        sels[name] = pd.read_csv(out / name / "selectors.csv")
    res = write_pooled(sels, totals, out)
    return {**res, "curricula": list(curricula), "seeds": seeds}


def pool_validations(dirs: list[Path], out: Path) -> dict:
    """The per-curriculum and pooled tables of finished validations (each DIR holds a
    ``validate`` output: selectors.csv, validity.json), e.g. runs made with different
    ``--config`` (the planted ladder under recipes/demo.yaml, the late-harm ladder under
    recipes/demo-late.yaml). Each is named by its folder."""
    sels, totals = {}, {}
    for d in dirs:
        d = Path(d)
        for f in ("selectors.csv", "validity.json"):
            if not (d / f).is_file():
                raise SystemExit(f"--pool {d}: no {f}; give the OUT folder of a finished validation.")
        sels[d.name] = pd.read_csv(d / "selectors.csv")
        totals[d.name] = json.loads((d / "validity.json").read_text(encoding="utf-8"))
    if len(sels) != len(dirs):
        raise SystemExit(f"--pool: two folders share a name ({[Path(d).name for d in dirs]}); rename one.")
    return write_pooled(sels, totals, Path(out))


#: The small outputs of a finished validation that a record keeps (``--record``): enough to pool it with
#: others (:func:`pool_validations`) and to read every table of bench/VALIDITY.md, without the ladders,
#: adapters and pilot runs (gigabytes).
RECORD_FILES = ("selectors.csv", "selector_summary.csv", "validity.csv", "ties.csv", "truth_values.csv",
                "validity.json", "validity.md")


def _seeds_label(seeds: list[int]) -> str:
    """``s90-94`` for a run of consecutive seeds, else ``s5-7-9``."""
    s = sorted(int(x) for x in seeds)
    return f"s{s[0]}-{s[-1]}" if len(s) > 1 and s == list(range(s[0], s[-1] + 1)) else "s" + "-".join(map(str, s))


def _ladder_cpus(run_dir: Path, seeds: list[int]) -> list[dict]:
    """The distinct ``cpu`` entries (processor, torch's CPU kernel instruction set) of the run's toy ladders
    (``seed<S>/ladder/ladder.json``). The same seed builds another ladder on another kind of CPU
    (docs/toy-ladder.md, "Another CPU type, another ladder"), so a record names the ladders' CPU."""
    cpus: list[dict] = []
    for s in seeds:
        f = Path(run_dir) / f"seed{s}" / "ladder" / "ladder.json"
        cpu = json.loads(f.read_text(encoding="utf-8")).get("cpu") if f.is_file() else None
        if cpu and cpu not in cpus:
            cpus.append(cpu)
    return cpus


def _interval_items(run_dir: Path, seeds: list[int]) -> pd.DataFrame | None:
    """bench/interval_items.py's table (seed-only vs seeds+items interval of every pilot and confirmation
    decision) for the run, or None when the run kept no pipeline decisions (the declared secondary analysis,
    bench/late_harm_notes.md: an item-aware rule is a candidate only if it costs no correct decision)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("interval_items", ROOT / "bench" / "interval_items.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    t = mod.table(Path(run_dir), seeds)
    return t if len(t) else None


def save_record(run_dir: Path, records: Path, name: str, argv: list[str]) -> Path:
    """Copy the :data:`RECORD_FILES` of the finished validation ``run_dir`` into ``records/<name>-<seeds>/``
    (written under a temporary name, then renamed: never a partial record), with ``record.json``
    (command, commit, wall seconds, the ladders' CPU) and ``interval_items.csv`` (bench/interval_items.py's table, when the
    run's pipeline decisions are there), and add its row to ``records/README.md`` when that file exists."""
    run_dir, records = Path(run_dir), Path(records)
    missing = [f for f in RECORD_FILES if not (run_dir / f).is_file()]
    if missing:
        raise SystemExit(f"--record: {run_dir} has no {', '.join(missing)}: the validation did not finish, "
                         "so there is nothing to record; rerun it (it resumes).")
    try:
        tot = json.loads((run_dir / "validity.json").read_text(encoding="utf-8"))
        seeds = [int(x) for x in tot["seeds"]]
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--record: {run_dir / 'validity.json'} is not a validation's totals ({e}); rerun the "
                         "validation into that folder (it resumes) before recording it.") from None
    folder = records / f"{name}-{_seeds_label(seeds)}"
    if folder.exists():
        raise SystemExit(f"--record: {folder} already exists; records are never overwritten: remove it or "
                         "pass another --record folder.")
    from probeselect.manifest import git_state

    git = git_state(ROOT)
    commit, dirty = git["commit"], git["dirty"]
    command = "python bench/validity.py " + shlex.join(str(x) for x in argv)
    rec = {"command": command, "commit": commit, "dirty": dirty, "seeds": tot["seeds"], "config": tot.get("config"),
           "curriculum": tot.get("curriculum"), "tiny": tot.get("tiny"), "seconds": tot.get("seconds"),
           **({"seconds_parts": tot["seconds_parts"]} if tot.get("seconds_parts") else {}),
           "cpu": _ladder_cpus(run_dir, seeds)}
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in RECORD_FILES:
        shutil.copy2(run_dir / f, tmp / f)
    items = _interval_items(run_dir, seeds)
    if items is not None:
        atomic_write_csv(tmp / "interval_items.csv", items)
    atomic_write_json(tmp / "record.json", rec)
    os.replace(tmp, folder)
    readme = records / "README.md"
    if readme.is_file():
        sha = (commit[:7] + (" + uncommitted changes" if dirty else "")) if commit else "unknown"
        cur = tot.get("curriculum") or "(the config's own)"
        cpu = ", ".join(f"{c.get('model')} ({c.get('torch_cpu_capability')})" for c in rec["cpu"]) or "CPU not recorded"
        n_parts = len(tot.get("seconds_parts") or [])
        parts = f" in {n_parts} parts (resumed)" if n_parts > 1 else ""
        row = (f"| `{folder.name}` | {cur} | `{tot.get('config')}` | "
               f"{_seeds_label(tot['seeds'])[1:]} | `{command}` | {sha} | {cpu}, {tot.get('seconds', 0):,.0f} s{parts} |\n")
        text = readme.read_text(encoding="utf-8")
        atomic_write_text(readme, text + ("" if text.endswith("\n") else "\n") + row)
    return folder


def write_pooled(sels: dict[str, pd.DataFrame], totals: dict[str, dict], out: Path) -> dict:
    """Write the per-curriculum and pooled selector tables of ``sels`` (name -> selectors.csv)."""
    names = list(sels)
    by, pooled = pooled_tables(sels)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(out / "selector_summary_by_curriculum.csv", by)
    atomic_write_csv(out / "selector_summary_pooled.csv", pooled)
    atomic_write_csv(out / "selectors_pooled.csv",
                     pd.concat([s.assign(curriculum=n) for n, s in sels.items()], ignore_index=True))
    taus = {n: {k: t[k] for k in ("mean_tau_probes", "mean_tau_step", "mean_tau_neg_bpb")} for n, t in totals.items()}
    md = []
    for name in names:
        t = totals[name]
        md.append(f"## {name} (seeds {' '.join(map(str, t.get('seeds', [])))})\n\n" + _markdown(by[by["curriculum"] == name]
                                                                              .drop(columns="curriculum"))
                  + f"\n\nmean tau probes {t['mean_tau_probes']:.2f}, step {t['mean_tau_step']:.2f}, "
                    f"-bpb {t['mean_tau_neg_bpb']:.2f}; false clear winners on ties {t['false_clear_winners']}/"
                    f"{t['ties_counted']}\n")
    md.append(f"## pooled over {', '.join(names)}\n\n" + _markdown(pooled) + "\n")
    atomic_write_text(out / "curricula.md", "\n".join(md))
    res = {"folders": names, "seeds_by_folder": {n: totals[n].get("seeds") for n in names}, "tau": taus,
           "pooled": pooled.to_dict("records"),
           "seconds": round(sum(t.get("seconds", 0) for t in totals.values()), 1)}
    atomic_write_json(out / "curricula.json", res)
    return res


def _recipe_seeds(section: dict) -> list[int]:
    """The SFT seeds a pipeline section trains (its ``seeds=`` override, else the recipe's)."""
    for o in reversed(list(section.get("overrides") or [])):
        if isinstance(o, str) and o.startswith("seeds="):
            return [int(x) for x in json.loads(o.split("=", 1)[1])]
    return [int(x) for x in load_yaml(Path(section["recipe"])).get("seeds", [0])]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=FRESH_SEEDS,
                    help=f"toy seeds (default {' '.join(map(str, FRESH_SEEDS))}: fresh; {DEV_SEEDS} were used in development)")
    ap.add_argument("--out", type=Path, default=Path("results/validity"))
    ap.add_argument("--config", type=Path, default=ROOT / "recipes" / "demo.yaml", help="pipeline config")
    ap.add_argument("--truth-seeds", type=int, default=4, help="number of SFT seeds of the ground truth (default 4)")
    ap.add_argument("--truth-seed-start", type=int, default=TRUTH_SEED_START,
                    help=f"first truth SFT seed (default {TRUTH_SEED_START}; must not overlap the pilot/confirm seeds)")
    ap.add_argument("--twin-noise", type=float, default=TWIN_NOISE, help=f"perturbed twins' relative weight noise "
                    f"(default {TWIN_NOISE})")
    ap.add_argument("--tiny", action="store_true", help="smoke version: tiny ladder and budgets (plumbing only)")
    ap.add_argument("--curriculum", nargs="+", default=None, metavar="NAME",
                    help="toy-ladder curricula (built-in names: planted, uniform, late-harm, negative-control; or "
                         "YAML paths): one validation per curriculum into OUT/<name>/, one selector table each and "
                         "a pooled table (OUT/curricula.md). Default: the config's own (planted) into OUT/")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (default 1 = in this process; "
                    "on N cores use N: every stage runs single-threaded, the seeds' stages are scheduled across the workers)")
    ap.add_argument("--pool", type=Path, nargs="+", default=None, metavar="DIR",
                    help="no run: write the per-curriculum and pooled tables of finished validations (their OUT "
                         "folders, e.g. made with different --config) into --out")
    ap.add_argument("--record", type=Path, default=None, metavar="DIR",
                    help="after the run, keep its small outputs (selector, truth-value, tie and total tables, and "
                         "record.json with the command and commit) in DIR/<curriculum>-s<seeds>/ and add a row to DIR/README.md, e.g. "
                         "bench/validity_runs (so that later pools need no rerun)")
    ap.add_argument("--budget-estimate", action="store_true", help="print the estimated CPU time and wall time and exit")
    a = ap.parse_args(argv)
    if a.truth_seeds < 1:
        ap.error("--truth-seeds must be >= 1")
    if a.record and (a.pool or a.budget_estimate):
        ap.error("--record keeps the outputs of a run; --pool and --budget-estimate run nothing to record")
    if a.budget_estimate:
        est = budget_estimate(len(a.seeds) * len(a.curriculum or [None]), a.truth_seeds, a.jobs)
        print(json.dumps({**est, "curricula": a.curriculum or ["(config's own)"]}, indent=1))
        return 0
    if set(a.seeds) & set(DEV_SEEDS):
        print(f"note: seeds {sorted(set(a.seeds) & set(DEV_SEEDS))} were used in development; not a held-out test",
              file=sys.stderr)
    if a.pool:
        res = pool_validations(a.pool, a.out)
        print((a.out / "curricula.md").read_text(encoding="utf-8"))
        print(json.dumps({k: v for k, v in res.items() if k != "pooled"}))
        return 0
    try:
        return _run(a, list(sys.argv[1:] if argv is None else argv))
    except ProbeselectError as e:  # a bad config, curriculum or input: one line, no traceback
        hint = (" (--tiny builds 24-step ladders: a built-in curriculum name scales to them, a curriculum file "
                "written for another length does not; use e.g. --curriculum late-harm)"
                if a.tiny and isinstance(e, CurriculumError) else "")
        print(f"error: {e}{hint}", file=sys.stderr)
        return 2


def _run(a: argparse.Namespace, argv_used: list[str]) -> int:
    """The validation (or validations, one per curriculum) ``main`` parsed, and its record."""
    kw = dict(config=a.config, truth_seeds=a.truth_seeds, tiny=a.tiny, jobs=a.jobs,
              truth_seed_start=a.truth_seed_start, twin_noise=a.twin_noise)
    if a.curriculum:
        res = validate_curricula(a.curriculum, a.seeds, a.out, **kw)
        print((a.out / "curricula.md").read_text(encoding="utf-8"))
        print(json.dumps({k: v for k, v in res.items() if k != "pooled"}))
        for c in (a.curriculum if a.record else []):
            name = curriculum_dirname(c)
            print(f"record: {save_record(a.out / name, a.record, name, argv_used)}")
        return 0
    totals = validate(a.seeds, a.out, **kw)
    if a.record:
        print(f"record: {save_record(a.out, a.record, Path(a.config).stem, argv_used)}")
    print((a.out / "validity.md").read_text(encoding="utf-8"))
    print(json.dumps({k: v for k, v in totals.items() if k not in ("selectors", "transfer_suites")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
