"""Synthetic inputs for the selection tests: a scored run (summary/scores/manifest) and
pilot outputs in the exact contract layout (transfer.csv, transfer_items.parquet,
diagnostics.csv), so select / confirm / report can be tested without training."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from probeselect._io import atomic_write_csv, atomic_write_json, atomic_write_parquet
from probeselect.manifest import base_manifest
from probeselect.tables import summarize_scores

# Per-checkpoint mean margins of two conflict families and a capability family (6 checkpoints).
STEPS = [10, 20, 30, 40, 50, 60]
MEANS = {("conf", "a"): [0.5, -0.2, 0.4, 0.9, 0.1, 0.6], ("conf", "b"): [0.3, 0.1, -0.3, 0.8, 0.2, 0.7],
         ("rel", "x"): [0.2, 0.0, 0.3, 0.7, 0.4, 0.5], ("cap", "x"): [0.1, 0.4, 0.6, 0.8, 0.9, 1.0]}

PLAN = """\
description: test plan
proxies:
  - {family: conf, variant: "*", metric: mean_margin, direction: higher}
  - {family: rel, variant: x, metric: mean_margin}
k: 3
selection:
  primary: {metric: task_accuracy, direction: higher}
  constraints:
    - {metric: termination, min: 0.5}
  decision: {tie_margin: 0.02}
  uncertainty: {bootstrap: 500, seed: 0}
"""


def make_score_run(path: Path, steps=STEPS, *, ladder: str = "/ladder") -> Path:
    rows = []
    for (fam, var), means in MEANS.items():
        for step, m in zip(steps, means):
            for seed in (0, 1):
                for i, off in enumerate((-0.4, -0.1, 0.1, 0.4)):
                    mg = m + off + (0.05 if seed else -0.05)
                    rows.append(dict(checkpoint=f"checkpoint-{step}", step=step, tokens=step * 64, family=fam,
                                     variant=var, seed=seed, item_id=f"{fam}/{var}/{i}", margin=mg,
                                     margin_per_token=mg / 2, correct=mg > 0, candidate_correct=mg > 0.2))
    scores = pd.DataFrame(rows)
    summary = summarize_scores(scores, n_boot=50)
    summary["kind"] = np.where(summary["family"] == "cap", "capability", "conflict")
    man = base_manifest("score", {"seeds": [0, 1]})
    man.update(status="complete", seeds=[0, 1], items_hash="abc123",
               checkpoints=[{"name": f"checkpoint-{s}", "step": s, "tokens": s * 64, "fingerprint": f"fp{s:04d}",
                             "tokenizer_hash": "tok", "path": f"{ladder}/checkpoint-{s}"} for s in steps],
               probes=[], created_utc="2000-01-01T00:00:00+00:00")
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_parquet(path / "scores.parquet", scores)
    atomic_write_csv(path / "summary.csv", summary)
    atomic_write_json(path / "manifest.json", man)
    return path


def make_selected_run(root: Path, *, lineage: bool = True) -> Path:
    """A whole selection run under ``root`` without training: a ladder folder (with a
    ``data_lineage.json`` of two windows when ``lineage``), a scored run ``root/run``, the
    plan ``root/plan.yaml`` locked, a shortlist (checkpoint-40, -60, -50), a fake pilot and
    ``select``. Returns the run folder; every path recorded in it is absolute under ``root``."""
    from probeselect.plan import lock_plan
    from probeselect.select import select
    from probeselect.shortlist import shortlist

    ladder = root / "ladder"
    ladder.mkdir(parents=True, exist_ok=True)
    if lineage:
        atomic_write_json(ladder / "data_lineage.json", {"windows": [
            {"name": "base", "start_step": 0, "end_step": 30},
            {"name": "parrot", "start_step": 30, "end_step": 60, "planted": "shortcut"}]})
    d = make_score_run(root / "run", ladder=str(ladder))
    # pretraining held-out bits per byte, lowest at checkpoint-30 (never piloted)
    summary = pd.read_csv(d / "summary.csv")
    bpb = {10: 1.9, 20: 1.5, 30: 1.2, 40: 1.3, 50: 1.35, 60: 1.4}
    held = pd.DataFrame([dict(checkpoint=f"checkpoint-{s}", step=s, tokens=s * 64, family="heldout_nll",
                              variant="bpb", kind="nll", bits_per_byte=v, n_seeds=1) for s, v in bpb.items()])
    atomic_write_csv(d / "summary.csv", pd.concat([summary, held], ignore_index=True))
    plan = root / "plan.yaml"
    plan.write_text(PLAN)
    lock_plan(plan, d, allow_weak=True)
    shortlist(d, plan)
    names = ["checkpoint-40", "checkpoint-60", "checkpoint-50"]
    write_fake_pilot(d / "pilot", {b: {"task_accuracy": a, "termination": 0.9}
                                   for b, a in zip(names, (0.85, 0.45, 0.40))})
    select(d)
    return d


def write_fake_pilot(out: Path, truth: dict[str, dict[str, float]], *, seeds=(0, 1, 2), n_items: int = 60,
                     rng_seed: int = 0, diagnostics: dict | None = None) -> Path:
    """Pilot outputs in the contract layout. ``truth[base][metric]`` is the success probability
    (accuracy-like metrics: Bernoulli per item) or the mean (heldout_loss: normal per item)."""
    rng = np.random.default_rng(rng_seed)
    items, transfer, diag = [], [], []
    for base, metrics in truth.items():
        for s in seeds:
            for metric, p in metrics.items():
                if metric.startswith("heldout"):
                    vals = rng.normal(p, 0.3, n_items)
                else:
                    vals = (rng.random(n_items) < p).astype(float)
                for i, v in enumerate(vals):
                    items.append(dict(base=base, seed=s, metric=metric, item_id=f"{metric[:4]}-{i}", kind="task",
                                      value=float(v)))
                transfer.append(dict(base=base, seed=s, metric=metric, value=float(vals.mean()), n=n_items))
            d = dict(base=base, seed=s, steps=40, sup_tokens=4000, clip_fraction=0.1, grad_norm_p50=0.5,
                     grad_norm_p90=0.9, grad_norm_max=1.5, nonfinite=0, skipped=0, spikes=0, resumes=0,
                     seconds=3.0, tokens_per_s=1300.0)
            d.update((diagnostics or {}).get((base, s), {}))
            diag.append(d)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_csv(out / "transfer.csv", pd.DataFrame(transfer))
    atomic_write_parquet(out / "transfer_items.parquet", pd.DataFrame(items))
    atomic_write_csv(out / "diagnostics.csv", pd.DataFrame(diag))
    atomic_write_json(out / "manifest.json", {"kind": "pilot", "bases": [{"name": b, "path": f"/ladder/{b}"}
                                                                        for b in truth]})
    return out


def simulate_pilot_items(rng: np.random.Generator, *, studies: int, true_means, n_seeds: int, n_items: int = 100,
                         sd_seed: float = 0.3, sd_base_seed: float = 0.15, sd_item: float = 1.0,
                         sd_item_effect: float = 0.5) -> np.ndarray:
    """Per-item transfer values of ``studies`` synthetic pilots, array (studies, k, n_seeds, n_items).

    value = true mean of the base + seed effect shared by every base trained under that seed
    (sd ``sd_seed``) + base x seed interaction (``sd_base_seed``) + item difficulty shared by
    every run (``sd_item_effect``) + item noise (``sd_item``). The seed value of a run is the
    item mean, so item noise reaches the decision through it. Units are arbitrary (think
    nats per token); the known true difference of bases i and j is true_means[i] - true_means[j].
    """
    mu = np.asarray(true_means, float)
    k = len(mu)
    u = rng.normal(0.0, sd_seed, (studies, 1, n_seeds, 1))
    w = rng.normal(0.0, sd_base_seed, (studies, k, n_seeds, 1))
    a = rng.normal(0.0, sd_item_effect, (studies, 1, 1, n_items))
    e = rng.normal(0.0, sd_item, (studies, k, n_seeds, n_items))
    return mu[None, :, None, None] + u + w + a + e


def lock_for(run_dir: Path, sel: dict) -> dict:
    """Write a plan file and a plan.lock.json into ``run_dir`` that match the synthetic
    selection record ``sel`` (the report recomputes predeclared/POST-HOC from them); returns
    ``sel`` with its plan path and hashes pointing at them."""
    import tempfile

    from probeselect._io import sha256_file

    # outside the test's folder: its name (the test's) would otherwise appear in the report's Predeclared line
    plan = Path(tempfile.mkdtemp(prefix="plan-")) / "plan.yaml"
    plan.write_text(PLAN)
    sha = sha256_file(plan)
    lock = {"kind": "plan_lock", "locked_utc": "2026-01-01T00:00:00+00:00", "plan_path": str(plan),
            "plan_sha256": sha, "outcome_files_at_lock": [], "shortlist_files_at_lock": []}
    atomic_write_json(run_dir / "plan.lock.json", lock)
    return {**sel, "plan_path": str(plan), "plan_sha256": sha, "lock": {**sel.get("lock", {}), "plan_sha256": sha}}
