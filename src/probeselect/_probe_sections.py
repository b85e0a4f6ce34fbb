"""The probe-evidence sections of a report: summary, shortlist, trajectories, accuracy
against margin, signal and noise, correlation across probes and averaging vs raw.

:func:`probe_sections` builds them for one scored run (recomputing ``run_dir/dynamics/``);
:mod:`probeselect.report` (probe report) and :mod:`probeselect.final_report` (base
selection report) both place them, so this module imports neither.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ._io import sha256_file
from ._report_blocks import Bullets, Figure, Para, Section, Table, df_table, fmt, shown_path
from .errors import ProbeselectError

__all__ = ["ProbeSections", "probe_sections", "find_averaged_run", "plot_averaging"]


# ---------------------------------------------------------------------------
# Finding the pieces
# ---------------------------------------------------------------------------


def find_averaged_run(run_dir: Path, averaged_run_dir: str | Path | None = None) -> Path | None:
    """The averaged run folder to compare with (see the module docstring), or None."""
    if averaged_run_dir is not None:
        p = Path(averaged_run_dir)
        if not (p / "summary.csv").is_file():
            raise ProbeselectError(f"{p}: no summary.csv; score the averaged checkpoints there first "
                                   f"(`probeselect score AVG_DIR --probes ... --out {p}`).")
        return p
    if (run_dir / "averaged" / "summary.csv").is_file():
        return run_dir / "averaged"
    pointer = run_dir / "averaged.json"
    if pointer.is_file():
        try:
            target = Path(json.loads(pointer.read_text(encoding="utf-8"))["run_dir"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise ProbeselectError(f'{pointer}: expected {{"run_dir": "<averaged run folder>"}}. Fix the file.') from None
        target = target if target.is_absolute() else run_dir / target
        if not (target / "summary.csv").is_file():
            raise ProbeselectError(f"{pointer}: points to {target}, which has no summary.csv. Fix the path or score it.")
        return target
    return None


def _read_shortlist(run_dir: Path) -> tuple[pd.DataFrame | None, dict | None]:
    csv, js = run_dir / "shortlist.csv", run_dir / "shortlist.json"
    if not csv.is_file():
        return None, None
    meta = json.loads(js.read_text(encoding="utf-8")) if js.is_file() else {}
    return pd.read_csv(csv), meta


# ---------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------


def _margin_stats(stats: pd.DataFrame) -> pd.DataFrame:
    return stats[stats["metric"] == "mean_margin"]


def _cross_family_rho(dyn) -> tuple[list[float], list[float], tuple | None]:
    """Off-diagonal Spearman values: (all pairs, pairs of different families, lowest pair)."""
    rho = dyn.correlation
    names = list(rho.columns)
    fam = {t: t.split("/")[0] for t in names}
    allv, cross, low = [], [], None
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            r = rho.loc[a, b]
            if np.isfinite(r):
                allv.append(r)
                if fam[a] != fam[b]:
                    cross.append(r)
                if low is None or r < low[2]:
                    low = (a, b, r)
    return allv, cross, low


def _nats(x: float, why: str) -> str:
    """``0.123 nats``, or ``n/a (why)`` for a missing value (never "nan nats")."""
    return f"{x:.3g} nats" if x is not None and np.isfinite(x) else f"n/a ({why})"


def _track_list(df: pd.DataFrame, col: str, limit: int = 8) -> str:
    parts = [f"`{r.track}` {fmt(getattr(r, col))}" for r in df.itertuples()]
    return ", ".join(parts[:limit]) + (f", and {len(parts) - limit} more" if len(parts) > limit else "")


def hop_headline(stats: pd.DataFrame, n_ck: int) -> list[str]:
    """Summary bullets on hops (module :mod:`probeselect.dynamics`): conflict tracks in the
    headline, capability tracks named separately, learning crossings apart from hops."""
    from .dynamics import HOP_K, MIN_HOP_NATS

    ms = _margin_stats(stats)
    out: list[str] = []
    rule = (f"a hop is a move later undone (a rise then a fall, or the reverse) whose both legs exceed "
            f"h = {HOP_K:g} x sqrt(2 / n seeds) x the pooled evaluation-seed sd ({HOP_K:g} standard errors of a "
            f"difference between two checkpoints), and at least {MIN_HOP_NATS:g} nats")
    if n_ck < 3:
        return [f"**Hops**: n/a (needs >= 3 checkpoints; this run has {n_ck}). {rule[0].upper()}{rule[1:]}."]
    for kind, label in (("conflict", "conflict"), ("capability", "capability")):
        k = ms[ms["kind"] == kind]
        if not len(k):
            continue
        known = k[np.isfinite(k["hops"].astype(float))]
        hopping = known[known["hops"] > 0]
        h_med = float(np.median(known["hop_threshold"])) if len(known) else float("nan")
        learn = k[k["learning_crossings"].fillna(0) > 0]
        if kind == "conflict":
            txt = (f"**Hops (conflict tracks)**: {int(hopping['hops'].sum())} hop(s) on {len(hopping)} of {len(k)} "
                   f"conflict tracks over {n_ck} checkpoints")
            txt += f" ({_track_list(hopping, 'hops')})." if len(hopping) else "."
            txt += f" Rule: {rule} (median h {_nats(h_med, 'needs >= 2 evaluation seeds')})."
        else:
            txt = (f"**Capability tracks** (named separately; a capability hop is lost skill, not shortcut preference): "
                   f"{int(hopping['hops'].sum())} hop(s) on {len(hopping)} of {len(k)} tracks")
            txt += f" ({_track_list(hopping, 'hops')})." if len(hopping) else "."
        if len(known) < len(k):
            txt += (f" {len(k) - len(known)} track(s) n/a: no evaluation-seed sd (score with >= 2 seeds).")
        if len(learn):
            txt += (f" {len(learn)} {label} track(s) end on the other side of zero from where they started "
                    "(learning crossings, not hops): "
                    + ", ".join(f"`{t}`" for t in learn["track"][:8]) + ("..." if len(learn) > 8 else "") + ".")
        out.append(txt)
    return out


def _summary_section(dyn, sl: pd.DataFrame | None, sl_meta: dict | None, avg_cmp: pd.DataFrame | None,
                     stale: bool, run_dir: Path = Path(".")) -> Section:
    items: list[str] = []
    n_ck = int(dyn.stats["n_checkpoints"].max()) if len(dyn.stats) else 0
    if sl is not None:
        sel = sl[sl["selected"].astype(bool)].sort_values("shortlist_position")
        # references piloted beyond the shortlist (the plan's `references:`): shortlist.json marks each one
        refs = {str(s["checkpoint"]): s["reference"] for s in (sl_meta or {}).get("selected") or [] if "reference" in s}
        short = [c for c in sel["checkpoint"] if str(c) not in refs]
        if len(sel):
            items.append(f"**Shortlisted ({len(short)})**: " + ", ".join(f"`{c}`" for c in short) +
                         f" (plan `{shown_path((sl_meta or {}).get('config', {}).get('plan', '?'), run_dir)}`)"
                         + (f"; **piloted next to them ({len(refs)})**: "
                            + ", ".join(f"`{c}` ({r})" for c, r in refs.items()) if refs else "")
                         + ". Each is a hypothesis for matched pilot SFT, not a selection.")
            for r in sel.itertuples():
                items.append(f"`{r.checkpoint}`: {r.reason}")
        else:
            items.append("**No checkpoint passed the plan** (see the shortlist table for each reason).")
        opw = sl[sl["one_probe_winner"].astype(bool)]["checkpoint"].tolist() if "one_probe_winner" in sl else []
        if opw:
            items.append("One-probe winners, excluded: " + ", ".join(f"`{c}`" for c in opw) + ".")
        if stale:
            items.append("**Warning:** summary.csv changed after the shortlist was made; re-run `probeselect shortlist`.")
    else:
        items.append("No shortlist yet: run `probeselect shortlist RUN_DIR --plan recipes/selection.yaml`, "
                     "with the plan fixed before looking at these results.")
    ms = _margin_stats(dyn.stats)
    if len(ms):
        items.extend(hop_headline(dyn.stats, n_ck))
        fr = ms["flip_rate"].dropna()
        if len(fr):
            worst = ms.loc[ms["flip_rate"].idxmax()]
            items.append(f"**Item flips**: between consecutive checkpoints, on average {fr.mean():.1%} of item x seed "
                         f"answers flip correctness (most on `{worst['track']}`: {worst['flip_rate']:.1%} per pair, "
                         f"up to {worst['flip_rate_max']:.1%}).")
        snr = ms["snr_last"].replace([np.inf], np.nan).dropna()
        if len(snr):
            lo = ms.loc[snr.idxmin()]
            items.append(f"**Signal to noise** (range across checkpoints / sd of the last {int(lo['noise_window'])}): "
                         f"median {snr.median():.3g}; lowest `{lo['track']}` at {lo['snr_last']:.3g}. "
                         f"Median seed sd {_nats(ms['noise_seed_sd'].median(), 'needs >= 2 evaluation seeds')} vs "
                         f"trend-free checkpoint jitter "
                         f"{_nats(ms['noise_last_diff_sd'].median(), 'needs >= 3 checkpoints')}.")
        elif n_ck < 3:
            items.append(f"**Signal to noise**: n/a (needs >= 3 checkpoints; this run has {n_ck}).")
        flagged = int(dyn.pairs["flag_acc_moves_margin_still"].sum()) if len(dyn.pairs) else 0
        hidden = int(dyn.pairs["flag_margin_moves_acc_still"].sum()) if len(dyn.pairs) else 0
        items.append(f"**Accuracy vs margin**: {flagged} consecutive pair(s) where accuracy moved a lot while the "
                     f"mean margin barely moved (zero crossings), and {hidden} where the margin moved a lot while "
                     "accuracy did not: read the margins, not only accuracy.")
    allv, cross, low = _cross_family_rho(dyn)
    if allv:
        off = dyn.correlation_n.to_numpy()[~np.eye(len(dyn.correlation_n), dtype=bool)]
        txt = (f"**Agreement between probes** (oriented: higher = better for every track, so +1 = agree): median "
               f"Spearman rho {np.median(allv):.2f} over {len(allv)} track pairs "
               f"(each across up to {int(off.max())} checkpoints)")
        if cross:
            txt += f" ({np.median(cross):.2f} between different families)"
        txt += f"; lowest `{low[0]}` vs `{low[1]}` at {low[2]:.2f}."
        items.append(txt)
    if avg_cmp is not None and len(avg_cmp):
        tv = avg_cmp["tv_ratio"].dropna()
        fr = avg_cmp[["raw_flip_rate", "avg_flip_rate"]].dropna()
        w = avg_cmp["window"].iloc[0]
        what = f"**Averaging** ({fmt(w)} checkpoints)" if w is not None and pd.notna(w) else "**Averaging**"
        txt = f"{what}: total variation is {tv.median():.0%} of raw (median over tracks)" if len(tv) \
            else f"{what}: no comparable tracks"
        ex = avg_cmp[["raw_excess_variation", "avg_excess_variation"]].dropna()
        if len(ex):
            txt += (f"; movement later undone {ex['raw_excess_variation'].sum():.3g} nats raw vs "
                    f"{ex['avg_excess_variation'].sum():.3g} averaged (summed over tracks)")
        if len(fr):
            txt += f"; item flip rate {fr['raw_flip_rate'].mean():.1%} raw vs {fr['avg_flip_rate'].mean():.1%} averaged"
        items.append(txt + ". Below 100% / lower means averaging smoothed the probes; even then it mitigates "
                     "fluctuation rather than removing it.")
    for n in dyn.notes:
        items.append(f"Note: {n}")
    return Section("Summary", [Bullets(items)])


def _shortlist_section(sl: pd.DataFrame | None, meta: dict | None, run_dir: Path) -> Section:
    s = Section("Shortlist")
    if sl is None:
        s.blocks.append(Para("No shortlist in this run folder. Write a plan before looking at the results "
                             "(`recipes/selection.yaml` is the example), then run "
                             "`probeselect shortlist RUN_DIR --plan PLAN` and re-run `probeselect report RUN_DIR`."))
        return s
    plan = (meta or {}).get("plan", {})
    proxies = [p.get("id", "?") for p in plan.get("proxies", [])]
    agg = plan.get("aggregation", "mean_rank")
    s.blocks.append(Para(f"Plan `{shown_path((meta or {}).get('config', {}).get('plan', '?'), run_dir)}` (sha256 "
                         f"`{str((meta or {}).get('plan_sha256', ''))[:12]}`): {agg.replace('_', ' ')} over proxies "
                         + ", ".join(f"`{p}`" for p in proxies) + f"; k = {plan.get('k', '?')}. "
                         "Rank 1 = best, ranked on oriented values (higher = better after orientation: bits per byte "
                         "and losses are negated); a one-probe winner is first on one proxy but in the bottom half on "
                         "most others."))
    pairs = [("checkpoint", "checkpoint"), ("step", "step"), ("selected", "shortlisted"), ("shortlist_position", "#"),
             (agg, agg.replace("_", " ")), ("worst_rank", "worst rank"), ("one_probe_winner", "one-probe winner"),
             ("heldout_bpb", "pretraining held-out bpb"), ("passes_constraints", "constraints ok"), ("reason", "reason")]
    pairs = [(c, lab) for c, lab in pairs if c in sl.columns and not (c == "heldout_bpb" and sl[c].isna().all())]
    s.blocks.append(df_table(sl, [c for c, _ in pairs], [lab for _, lab in pairs]))
    s.blocks.extend(_rank_tables(sl, plan))
    notes = (meta or {}).get("notes", [])
    from .attribution import find_lineage

    lineage = find_lineage(run_dir)  # shortlist notes name it as recorded; print it as every other path here
    if lineage is not None:
        notes = [str(n).replace(str(lineage), shown_path(lineage, run_dir)) for n in notes]
    if notes:
        s.blocks.append(Bullets([f"Note: {n}" for n in notes]))
    return s


def _labelled(stats: pd.DataFrame) -> pd.DataFrame:
    """``stats`` with the track names that need it labelled (pretraining held-out bpb)."""
    from .metrics import LABELS

    return stats.assign(track=[f"{t} ({LABELS[t]})" if t in LABELS else t for t in stats["track"]])


def _hops_section(dyn) -> Section:
    from .dynamics import HOP_K, MIN_HOP_NATS

    st = _labelled(dyn.stats)
    cols = ["track", "kind", "n_checkpoints", "hops", "hop_legs", "hop_turning_steps", "hop_threshold",
            "learning_crossings", "sign_changes", "excess_variation", "total_variation"]
    labels = ["track", "kind", "n ckpt", "hops", "legs", "turning points (steps)", "threshold h", "learning crossings",
              "sign changes", "undone", "total variation"]
    return Section("Hops", [
        Para(f"A **hop** is a move later undone: a rise then a fall (or the reverse) whose both legs exceed the noise "
             f"threshold h = {HOP_K:g} x sqrt(2 / n) x s, where s is the track's pooled evaluation-seed sd (root mean "
             f"square of `seed_sd` over checkpoints) and n its number of evaluation seeds: {HOP_K:g} standard errors of "
             f"the difference between two checkpoint values, and at least {MIN_HOP_NATS:g} nats (seeds can agree to "
             "0.001 nats; a smaller move is not a change of behaviour). Legs come from a zig-zag filter (a turning point is "
             "confirmed once the track moves back from its running extreme by more than h); hops = floor(legs / 2), so "
             "monotone learning (one leg) has 0 hops, a dip that recovers 1, two dips 2. Learning crossings = 1 when the "
             "track ends on the other side of zero from where it started (a crossing that is not undone); sign changes "
             "count every zero crossing between consecutive checkpoints. Undone = total variation minus the net "
             "change (the movement later reversed). Margins and h in nats; bits per byte for the held-out NLL track, "
             "whose hops are n/a (no evaluation seeds). n/a = needs >= 3 checkpoints or >= 2 evaluation seeds."),
        df_table(st, cols, labels),
    ])


def _rank_tables(sl: pd.DataFrame, plan: dict, max_cols: int = 7) -> list[Any]:
    """The ranks per proxy, one table per proxy (its variants' ranks, its own rank, the
    fraction of variants in the top k), split further when a proxy has many variants, so
    no table runs off the page."""
    ids = [p.get("id") for p in plan.get("proxies", []) if p.get("id")]
    if not ids:  # an older shortlist.json: recover the proxies from the columns
        ids = [c[len("rank["):-1] for c in sl.columns if c.startswith("rank[") and "/*:" in c]
    out: list[Any] = []
    for pid in ids:
        fam, metric = pid.split("/", 1)[0], pid.rsplit(":", 1)[-1]
        var_cols = [c for c in sl.columns if c.startswith(f"rank[{fam}/") and c.endswith(f":{metric}]")
                    and c != f"rank[{pid}]"]
        extra = [c for c in (f"rank[{pid}]", f"topk_frac[{pid}]") if c in sl.columns]
        if not var_cols and len(extra) <= 1:
            continue  # a one-variant proxy: its rank is in the table above
        chunks = [var_cols[i:i + max_cols] for i in range(0, len(var_cols), max_cols)] or [[]]
        for i, chunk in enumerate(chunks):
            cols = ["checkpoint", *chunk, *(extra if i == len(chunks) - 1 else [])]
            labels = ["checkpoint", *[c[len("rank["):-1].split(":")[0].split("/", 1)[1] for c in chunk],
                      *[{"rank": "proxy rank", "topk_frac": "top-k share"}[c.split("[")[0]]
                        for c in (extra if i == len(chunks) - 1 else [])]]
            out.append(Para(f"Ranks of `{pid}` per prompt variant (1 = best; oriented: higher = better before ranking"
                            "; top-k share = fraction of variants on which the checkpoint is in the top k)"
                            + (f", part {i + 1} of {len(chunks)}" if len(chunks) > 1 else "") + ":"))
            out.append(df_table(sl, cols, labels))
    return out


def _attribution_section(run_dir: Path) -> Section | None:
    """Data-window attribution (:mod:`probeselect.attribution`), when the ladder has a data lineage."""
    from .attribution import write_attribution

    att = write_attribution(run_dir)
    if att is None:
        return None
    fam = att["families"]
    harmful = fam[fam["most_harmful"]]
    lines = [f"`{r.family}` ({r.metric}): **{r.window}**" + (f" (planted: {r.planted})" if isinstance(r.planted, str)
                                                              else "") + f", mean change {fmt(r.mean_change)}"
             f" (z {fmt(r.mean_change_z)})" for r in harmful.itertuples()]
    cols = ["family", "metric", "window", "planted", "start_step", "end_step", "n_tracks", "mean_change",
            "mean_change_z", "tracks_undoing_gains", "harm_rank", "most_harmful"]
    labels = ["family", "metric", "window", "planted", "from step", "to step", "tracks", "mean change", "mean z",
              "tracks undoing gains", "harm rank", "most harmful"]
    return Section("Data-window attribution", [
        Para(f"Windows from `{shown_path(att['lineage'], run_dir)}`. For each data window, the change of every "
             "track from the last checkpoint "
             "before the window to the last one inside it, oriented so that positive = better (bits per byte "
             "negated), averaged over the family's prompt variants; z = change / evaluation-seed sd. A window "
             "undoes earlier gains when the track loses, beyond noise, what training had gained before it. "
             "Per track: `dynamics/attribution.csv`."),
        Bullets(["Most harmful window: " + ln for ln in lines] if lines else
                ["No window loses more than the evaluation noise on any family."]),
        df_table(fam, cols, labels),
    ])


def _signal_noise_section(dyn) -> Section:
    cols = ["track", "signal_range", "noise_seed_sd", "noise_last_sd", "noise_last_diff_sd", "snr_last", "snr_seed",
            "flip_rate", "largest_drop", "largest_drop_step"]
    labels = ["track", "signal (range)", "seed sd", "sd last W", "jitter (diff sd)", "SNR (last W)", "SNR (seed)",
              "flip rate", "largest drop", "at step"]
    w = int(dyn.stats["noise_window"].max()) if len(dyn.stats) else 5
    return Section("Signal and noise", [
        Para(f"Signal = range of the checkpoint values; noise = mean seed sd, the sd of the last W = {w} checkpoints "
             "(Heineman et al., 2025) and a trend-free jitter (sd of their first differences / sqrt 2; n/a with fewer "
             "than 3 checkpoints). SNR = signal / noise; a probe with low SNR cannot order nearby checkpoints. Flip "
             "rate = fraction of item x seed answers whose correctness flips per consecutive pair; largest drop = the "
             "largest single worsening between consecutive checkpoints. Margins in nats; bits per byte for NLL."),
        df_table(_labelled(dyn.stats), cols, labels),
    ])


def _pairs_table(dyn, limit: int = 15) -> list[Any]:
    p = dyn.pairs
    if not len(p):
        return [Para("No consecutive pairs (fewer than two checkpoints).")]
    f = p[p["flag_acc_moves_margin_still"].astype(bool)]
    cols = ["track", "from_checkpoint", "to_checkpoint", "d_accuracy", "d_mean_margin", "flip_rate"]
    labels = ["track", "from", "to", "change in accuracy", "change in margin (nats)", "item flip rate"]
    if len(f):
        return [Para(f"Pairs where accuracy moved but the margin did not ({len(f)}; first {min(limit, len(f))}):"),
                df_table(f.head(limit), cols, labels)]
    top = p.reindex(p["d_accuracy"].abs().sort_values(ascending=False).index).head(5)
    return [Para("No pair was flagged. Largest accuracy moves and the margin change next to them:"),
            df_table(top, cols, labels)]


def plot_averaging(raw_traj: pd.DataFrame, avg_traj: pd.DataFrame, path: Path, *, max_panels: int = 12) -> Path:
    """One panel per margin track: raw trajectory and averaged trajectory (at the last source step)."""
    from ._plots import new_figure, save_png

    tracks = [t for t in dict.fromkeys(raw_traj["track"]) if t in set(avg_traj["track"])][:max_panels]
    fig, axes = new_figure(len(tracks))
    for ax, t in zip(axes, tracks):
        r, a = raw_traj[raw_traj["track"] == t], avg_traj[avg_traj["track"] == t]
        ax.plot(r["step"], r["value"], marker="o", ms=3, color="#7f7f7f", label="raw")
        ax.plot(a["step"], a["value"], marker="s", ms=3, color="#1f77b4", label="averaged")
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("mean margin (nats)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    return save_png(fig, path)


def _averaging_dip_blocks(avg_dir: Path, run_dir: Path | None = None) -> list[Any]:
    """How much checkpoint averaging reduces a planted dip: ``AVG_RUN/averaging_dip.csv``
    (:func:`probeselect.toy.dip.write_averaging_dip`), when the run wrote one."""
    path = avg_dir / "averaging_dip.csv"
    if not path.is_file():
        return []
    d = pd.read_csv(path)
    if d.empty:
        return []
    dipped = d[d["dipped_raw"].astype(str).str.lower() == "true"]
    k = d["k"].dropna().iloc[0] if d["k"].notna().any() else None
    kk = f"{int(k)}-checkpoint" if k is not None else "checkpoint"
    lines = []
    for r in dipped.itertuples():
        if pd.isna(r.depth_avg) or pd.isna(r.min_step_avg):
            avg, red = "no averaged value", ""
        elif r.depth_avg <= 0:
            avg = "no dip on the averaged ladder (its track does not fall below its reference)"
            red = f": the {kk} average hides the whole dip"
        else:
            avg = f"{fmt(r.depth_avg)} nats averaged (lowest at step {int(r.min_step_avg)})"
            red = f": the {kk} average removes {100 * r.reduction:.0f}% of its depth" if pd.notna(r.reduction) else ""
        lines.append(f"`{r.family}` ({r.window} window): depth {fmt(r.depth_raw)} nats raw (lowest at step "
                     f"{int(r.min_step_raw)}) vs {avg}{red}.")
    shown = shown_path(path, run_dir if run_dir is not None else avg_dir)
    intro = Para(f"Planted dip, raw vs {kk} averages (`{shown}`): depth = last value before the window minus the "
                 "lowest value inside it or right after it (nats; the same step range on both ladders). Averaging "
                 "hides part of a dip; it does not tell you which base is in which mode.")
    return [intro, Bullets(lines if lines else ["No conflict family dips in a planted window of the raw ladder."])]


def _averaging_section(run_dir: Path, avg_dir: Path | None, avg_cmp: pd.DataFrame | None, dyn) -> Section:
    s = Section("Averaging vs raw")
    if avg_dir is None or avg_cmp is None:
        s.blocks.append(Para("No averaged run found. To compare: `probeselect average CKPT_DIR --window 5 --out AVG_DIR`, "
                             "then `probeselect score AVG_DIR --probes ... --out RUN_DIR/averaged` (or write "
                             '`RUN_DIR/averaged.json` = {"run_dir": "..."}) and re-run the report.'))
        return s
    from .dynamics import load_run, track_table

    avg_tracks = track_table(load_run(avg_dir, need_scores=False).summary)
    fig = plot_averaging(dyn.trajectories[dyn.trajectories["metric"] == "mean_margin"],
                         avg_tracks[avg_tracks["metric"] == "mean_margin"], run_dir / "dynamics" / "averaging_vs_raw.png")
    s.blocks.append(Para(f"Averaged run: `{shown_path(avg_dir, run_dir)}`. Raw statistics use the raw checkpoints at the averaged "
                         "checkpoints' steps (an average is labelled with its last source step), so both rest on the same "
                         "number of consecutive pairs. TV = total variation (sum of |change| between consecutive "
                         "checkpoints, nats); undone = TV minus the net change (0 for a steady trend)."))
    cols = ["track", "n_checkpoints_avg", "raw_total_variation", "avg_total_variation", "tv_ratio",
            "raw_excess_variation", "avg_excess_variation", "raw_sign_changes", "avg_sign_changes", "raw_flip_rate",
            "avg_flip_rate"]
    labels = ["track", "n ckpt", "TV raw", "TV averaged", "TV ratio", "undone raw", "undone averaged",
              "sign changes raw", "sign changes averaged", "flip rate raw", "flip rate averaged"]
    s.blocks.append(df_table(avg_cmp, cols, labels))
    s.blocks.extend(_averaging_dip_blocks(Path(avg_dir), run_dir))
    s.blocks.append(Figure(fig, "Look for the averaged line (blue) still jumping or crossing zero: averaging smooths "
                                "the trajectory but does not remove mode-hopping.", "averaged vs raw margin trajectories"))
    for n in avg_cmp.attrs.get("notes", []):
        s.blocks.append(Para(f"Note: {n}"))
    return s



# ---------------------------------------------------------------------------
# The public entry point
# ---------------------------------------------------------------------------


def calibration_section(run_dir: Path) -> Section | None:
    """Raw margins next to their content-free reference (``score --calibrate``); None when the run
    has no ``<family>_cf`` rows (the report is then unchanged)."""
    from .probes._calibration import CONTENT_FREE, calibrated_margins

    path = run_dir / "summary.csv"
    if not path.is_file():
        return None
    cal = calibrated_margins(pd.read_csv(path))
    if cal.empty:
        return None
    fam = (cal.groupby(["family", "checkpoint"], sort=False)
           .agg(step=("step", "first"), mean_margin=("mean_margin", "mean"), cf_mean_margin=("cf_mean_margin", "mean"),
                calibrated_mean_margin=("calibrated_mean_margin", "mean"), accuracy=("accuracy", "mean"),
                cf_accuracy=("cf_accuracy", "mean"))
           .reset_index().sort_values(["family", "step", "checkpoint"], kind="stable"))
    per_var = cal.sort_values(["family", "variant", "step", "checkpoint"], kind="stable")
    return Section("Margins against a content-free reference", [
        Para(f"Each calibrated family was also scored with every query's content replaced by {CONTENT_FREE!r} (same "
             "demonstrations, format and candidates; contextual calibration). Its margin is the model's prior for the "
             "task answer over the shortcut before reading the query: the chance reference. **calibrated = raw - "
             "reference** is what the query's content adds; a model that ignores the query (e.g. a random-init "
             "checkpoint) sits near 0 whatever its raw margin, and a raw margin that the reference explains is no "
             "evidence of shortcut resistance. Means over each family's prompt variants, in nats; the content-free "
             "accuracy is the accuracy the prior alone gets."),
        df_table(fam, ["family", "checkpoint", "mean_margin", "cf_mean_margin", "calibrated_mean_margin", "accuracy",
                       "cf_accuracy"],
                 ["family", "checkpoint", "raw margin", "content-free reference", "calibrated margin", "raw accuracy",
                  "content-free accuracy"]),
        Para("Per prompt variant (a family whose variants answer with opposite labels, such as `real_truthy`, can cancel "
             "in a raw mean; its calibrated variants do not share the label prior):"),
        df_table(per_var, ["family", "variant", "checkpoint", "mean_margin", "cf_mean_margin", "calibrated_mean_margin"],
                 ["family", "variant", "checkpoint", "raw margin", "content-free reference", "calibrated margin"]),
    ])


class ProbeSections(NamedTuple):
    """The probe-evidence sections of a scored run (see :func:`probe_sections`)."""

    summary: Section
    evidence: list[Section]
    manifest: dict | None


def probe_sections(run_dir: str | Path, *, averaged_run_dir: str | Path | None = None) -> ProbeSections:
    """Build the probe report's sections: the summary, the evidence (shortlist, figures,
    signal and noise, correlation, averaging) and the scoring manifest. Recomputes
    ``run_dir/dynamics/``. Caveats and provenance are left to the caller."""
    from .average import compare_averaging
    from .dynamics import compute_dynamics, load_run

    run_dir = Path(run_dir)
    dyn = compute_dynamics(run_dir)
    manifest = load_run(run_dir, need_scores=False).manifest
    sl, sl_meta = _read_shortlist(run_dir)
    stale = bool(sl_meta and sl_meta.get("summary_sha256") and
                 sl_meta["summary_sha256"] != sha256_file(run_dir / "summary.csv"))
    avg_dir = find_averaged_run(run_dir, averaged_run_dir)
    avg_cmp = compare_averaging(run_dir, avg_dir) if avg_dir is not None else None

    figs = dyn.plots
    evidence = [
        _shortlist_section(sl, sl_meta, run_dir),
        *([c] if (c := calibration_section(run_dir)) is not None else []),
        Section("Margin trajectories", [Figure(
            figs["margin_trajectories"],
            "Look for lines that go up and come back down (or down and back up) by more than their seed band: those are "
            "hops (mode-hopping; counted in the Hops table). A line that crosses zero once and stays is learning, not a "
            "hop. A seed band narrower than the jumps means the jumps are not evaluation noise.",
            "margin trajectories with seed bands")]),
        Section("Accuracy against margin", [Figure(
            figs["accuracy_vs_margin"],
            "One panel per family (colours = prompt variants, legend in each panel), then every consecutive pair "
            "(colours = families). Look for ringed points: accuracy moved by 10 points or more while the mean margin "
            "moved by no more than the grey band, i.e. margins crossed zero without moving much; points far out on the "
            "x axis with no accuracy change are margin swings that accuracy hides.",
            "accuracy against mean margin"), *_pairs_table(dyn)]),
        _hops_section(dyn),
        _signal_noise_section(dyn),
        *([a] if (a := _attribution_section(run_dir)) is not None else []),
        Section("Correlation across probes", [Figure(
            figs["correlation"],
            "Spearman rho across checkpoints, oriented: higher = better for every track (bits per byte is negated), so "
            "red = the two tracks agree on which checkpoints are better and blue = they disagree. Look for pale or blue "
            "cells: a shortlist resting on one of those probes would not generalize.",
            "Spearman correlation heatmap")]),
        _averaging_section(run_dir, avg_dir, avg_cmp, dyn),
    ]
    return ProbeSections(_summary_section(dyn, sl, sl_meta, avg_cmp, stale, run_dir), evidence, manifest)

