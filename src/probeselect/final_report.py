"""The base-selection report: ``report.md`` and a self-contained ``report.html``.

``write_selection_report(run_dir)`` needs ``run_dir/selection.json`` (``probeselect
select``) and uses, when present, ``confirm.json``, ``pilot/diagnostics.csv``,
``confirm/diagnostics.csv`` and ``pilot/manifest.json``. The top section says in plain
words which base is recommended (or "no clear winner"), how sure we are, whether the
selection was predeclared (or POST-HOC) and whether the confirmation held. The evidence
follows: pilot transfer with seeds, run-correctness diagnostics per pilot run, proxy
validation against the selection-effect null, the confirmation, then the probe report's
sections (:func:`probeselect._probe_sections.probe_sections`), caveats and provenance. It
is rendered with the shared section model of :mod:`probeselect._report_blocks`, so
markdown and HTML say the same thing; this module imports nothing from
:mod:`probeselect.report`.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

import pandas as pd

from ._io import sha256_file
from .errors import SelectionError
from ._probe_sections import probe_sections
from ._report_blocks import (CAVEATS, Bullets, Para, ReportPaths, Section, Table, fmt, provenance_section, run_name,
                             write_documents)

__all__ = ["write_selection_report", "SELECTION_CAVEATS"]

SELECTION_CAVEATS = [
    "The ranking was tested at one post-training budget and recipe. Different learning curves can reverse it at another "
    "SFT/RL budget, data recipe or learning rate; the confirmation checks one larger budget, not every one.",
    "Transfer here means the declared held-out suite (task kinds absent from the SFT data, one prefill-attack analogue, "
    "termination, held-out SFT loss). Robustness measures the evaluated attack setup, not all safety.",
    "Selection on the toy world supports the choice in this tested setting; it does not establish that earlier (or later) "
    "bases generally win.",
    "With few bases, rank correlations between proxies and transfer are coarse (see the null); a proxy that agrees with "
    "transfer on three bases is weak evidence that it would agree on the next ladder.",
    "Selecting the best proxy after seeing the transfer ranking inflates its correlation: compare it with the best-of-M "
    "null, not with zero. Only a proxy fixed in the locked plan counts as prospective evidence.",
    "A bootstrap interval covers resampling of the evaluated items and SFT seeds; it does not cover other recipes, "
    "other item suites or systematic errors in the runs (check the run-correctness table).",
]


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * float(x):.0f}%"


def _read_json(p: Path) -> dict | None:
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def _read_csv(p: Path) -> pd.DataFrame | None:
    return pd.read_csv(p) if p.is_file() else None


def _g(x: Any) -> str:
    return fmt(float(x)) if x is not None else "n/a"


def _decision_section(sel: dict, conf: dict | None, diag: pd.DataFrame | None) -> Section:
    d = sel["decision"]
    prim = sel["selection_plan"]["primary"]
    metric, direction = prim["metric"], prim["direction"]
    level = d.get("level", 0.95)
    bases = {b["base"]: b for b in sel["bases"]}
    items: list[str] = []
    if sel.get("post_hoc"):
        items.append("**POST-HOC selection.** " + "; ".join(sel.get("post_hoc_reasons", [])) +
                     ". Treat this choice as exploratory, not as a predeclared test.")
    top, ru = d.get("top"), d.get("runner_up")

    def val(b: str) -> str:
        r = bases[b]
        return f"{_g(r['value'])} ({_pct(level)} interval {_g(r.get('ci_lo'))} to {_g(r.get('ci_hi'))})"

    n_seeds, n_items = len(d.get("seeds", [])), d.get("n_items")
    scope = f"over {n_seeds} SFT seed{'s' if n_seeds != 1 else ''} x {n_items} held-out items"
    verdict = d["verdict"]
    if verdict == "winner":
        items.append(f"**Recommended base: `{top}`.** It has the best {metric} ({direction} is better) among the bases "
                     "that pass the transfer constraints.")
    elif verdict == "no_clear_winner":
        items.append(f"**No clear winner** between `{top}` and `{ru}`: the interval of their {metric} difference reaches "
                     f"into the tie margin ({_g(d.get('tie_margin'))}). Pick on other grounds (cost, the confirmation "
                     "run) or run more seeds/items.")
    elif verdict == "single_eligible":
        items.append(f"**Recommended base: `{top}`**, the only base that passes the transfer constraints (no comparison).")
    else:
        items.append("**No recommendation**: no piloted base passes the transfer constraints (table below).")
    if top and ru:
        ci = d.get("diff_ci") or [None, None]
        items.append(f"**How sure**: {metric} of `{top}` {val(top)} vs runner-up `{ru}` {val(ru)}, {scope}. Difference "
                     f"{_g(d.get('diff'))} ({_pct(level)} interval {_g(ci[0])} to {_g(ci[1])}; tie margin "
                     f"{_g(d.get('tie_margin'))}); `{top}` beats `{ru}` in {_pct(d.get('p_top_beats_runner_up'))} of "
                     f"{sel['bootstrap']['replicates']} paired bootstrap replicates (items and seeds resampled).")
    elif top:
        items.append(f"**How sure**: {metric} of `{top}` {val(top)}, {scope}.")
    lock = sel.get("lock", {})
    if not sel.get("post_hoc"):
        items.append(f"**Predeclared**: the plan `{sel.get('plan_path')}` (sha256 `{str(sel.get('plan_sha256'))[:12]}`) "
                     f"was locked at {lock.get('locked_utc')}, before any pilot or transfer result existed, and is "
                     "unchanged since.")
    if conf is None:
        items.append("**Confirmation**: not run. Confirm at the intended budget before committing "
                     "(`probeselect confirm RUN_DIR --recipe recipes/confirm.yaml --top 2`).")
    else:
        tau = conf.get("kendall_tau")
        held = conf.get("held")
        word = {True: "held", False: "did NOT hold", None: "not applicable"}[held]
        statement = str(conf.get("statement", ""))
        prefix = f"The pilot decision {word}: "
        if statement.startswith(prefix):  # the heading already says it
            statement = statement[len(prefix):]
        items.append(f"**Confirmation {word}**: {statement} Kendall tau between pilot and confirmation "
                     f"rankings of {len(conf.get('bases', []))} bases: {_g(tau)}; {len(conf.get('reversals', []))} "
                     "reversal(s).")
    if diag is not None and len(diag):
        flags = sel.get("diagnostics_flags", [])
        clip = pd.to_numeric(diag.get("clip_fraction"), errors="coerce") if "clip_fraction" in diag else None
        clip_txt = (f"; clipping engaged on {_pct(clip.min())} to {_pct(clip.max())} of steps" if clip is not None
                    and clip.notna().any() else "")
        if flags:
            items.append(f"**Run correctness**: {len(diag)} pilot runs; flagged: " + "; ".join(flags) + clip_txt + ".")
        else:
            items.append(f"**Run correctness**: {len(diag)} pilot runs, no nonfinite events, skipped steps, loss spikes "
                         f"or resumes{clip_txt}.")
    pv = [p for p in sel.get("proxy_validation", []) if p.get("spearman") is not None]
    null = sel.get("null") or {}
    if pv and null:
        best = max(pv, key=lambda p: p["spearman"])
        items.append(f"**Proxies**: the best-agreeing predeclared proxy `{best['proxy']}` has Spearman "
                     f"{_g(best['spearman'])} with transfer over {best['n_bases']} bases; the best of "
                     f"{null.get('m_random_proxies')} random proxies has median {_g(null['spearman']['q50'])} and 95th "
                     f"percentile {_g(null['spearman']['q95'])} (chance of matching or beating "
                     f"{_g(best['spearman'])}: {_g(best['p_best_of_m_spearman'])} when picking the best proxy after the "
                     f"fact, {_g(best['p_single_spearman'])} for one proxy fixed in advance).")
    return Section("Decision", [Bullets(items)])


def _transfer_section(sel: dict, transfer: pd.DataFrame | None) -> Section:
    s = Section("Pilot transfer")
    prim = sel["selection_plan"]["primary"]
    cons = sel["selection_plan"]["constraints"]
    seeds = sel["decision"].get("seeds", [])
    s.blocks.append(Para(
        f"Primary metric `{prim['metric']}` ({prim['direction']} is better), averaged over SFT seeds {seeds}; interval = "
        f"{_pct(sel['bootstrap']['level'])} paired bootstrap over items and seeds ({sel['bootstrap']['replicates']} "
        f"replicates, numpy seed {sel['bootstrap']['seed']}); p best = share of replicates in which the base is the best "
        "eligible one. Constraints: " + (", ".join(
            f"`{c['metric']}`" + (f" >= {c['min']:g}" if c.get("min") is not None else "") +
            (f" <= {c['max']:g}" if c.get("max") is not None else "") for c in cons) or "none") +
        f". Decision rule: clear winner when the lower end of the top-vs-runner-up interval exceeds the tie margin "
        f"{sel['decision'].get('tie_margin')}."))
    rows = []
    for b in sel["bases"]:
        rows.append([f"`{b['base']}`", fmt(b.get("position")), fmt(b.get("eligible")), fmt(b.get("value")),
                     f"{fmt(b.get('ci_lo'))} to {fmt(b.get('ci_hi'))}",
                     *[fmt(b.get(f"seed{x}")) for x in seeds], fmt(b.get("p_best")),
                     b.get("failed_constraints") or "passes"])
    s.blocks.append(Table(["base", "#", "eligible", prim["metric"], "interval", *[f"seed {x}" for x in seeds],
                           "p best", "constraints"], rows))
    if transfer is not None and len(transfer):
        wide = transfer.pivot_table(index=["base", "seed"], columns="metric", values="value", aggfunc="mean").reset_index()
        metrics = [c for c in wide.columns if c not in ("base", "seed")]
        s.blocks.append(Para("Every transfer metric per pilot run (`transfer.csv`; held-out loss in nats per token and "
                             "bits per byte, token weighted):"))
        s.blocks.append(Table(["base", "seed", *metrics],
                              [[str(r["base"]), fmt(r["seed"]), *[fmt(r[m]) for m in metrics]]
                               for _, r in wide.iterrows()]))
    if sel.get("notes"):
        s.blocks.append(Bullets([f"Note: {n}" for n in sel["notes"]]))
    return s


_DIAG_COLS = ["base", "seed", "steps", "sup_tokens", "clip_fraction", "grad_norm_p50", "grad_norm_p90", "grad_norm_max",
              "nonfinite", "skipped", "spikes", "resumes", "tokens_per_s"]


def _diagnostics_section(diag: pd.DataFrame | None, conf_diag: pd.DataFrame | None) -> Section:
    s = Section("Run correctness")
    if diag is None:
        s.blocks.append(Para("No `pilot/diagnostics.csv`: run correctness of the pilot is unchecked."))
        return s
    s.blocks.append(Para("One row per pilot run (base x SFT seed). Clip fraction = share of optimizer steps where "
                         "global-norm clipping engaged; gradient norms are pre-clip; nonfinite = nonfinite-gradient "
                         "events; skipped = skipped steps (these change the step budget); spikes = loss above the "
                         "rolling median by more than the threshold; resumes = restarts from a saved state (see "
                         "lineage.json)."))
    cols = [c for c in _DIAG_COLS if c in diag.columns]
    s.blocks.append(Table(cols, [[fmt(v) for v in r] for r in diag[cols].itertuples(index=False)]))
    if conf_diag is not None:
        cols = [c for c in _DIAG_COLS if c in conf_diag.columns]
        s.blocks.append(Para("Confirmation runs:"))
        s.blocks.append(Table(cols, [[fmt(v) for v in r] for r in conf_diag[cols].itertuples(index=False)]))
    return s


def _proxy_section(sel: dict) -> Section:
    s = Section("Proxy validation")
    pv = sel.get("proxy_validation", [])
    null = sel.get("null")
    if not pv:
        s.blocks.append(Para("No proxy could be validated (see notes)."))
        return s
    m = null.get("m_random_proxies") if null else "?"
    s.blocks.append(Para(
        "Rank correlation between each predeclared shortlist proxy (oriented so higher = better) and the pilot transfer "
        "ranking, over the piloted bases. Null = the best correlation among M random proxies (random permutations of the "
        f"bases; M = {m}, the number of declared proxies; {null.get('method') if null else '?'}). p single = chance that "
        "one random proxy agrees at least as well (the test for a proxy fixed in advance); p best of M = chance that the "
        "best of M random proxies does (the test for a proxy picked after seeing the results)."))
    s.blocks.append(Table(["proxy", "n bases", "Spearman", "Kendall", "p single (Spearman)", "p best of M (Spearman)",
                           "p best of M (Kendall)", "beats null 95%"],
                          [[f"`{p['proxy']}`", fmt(p.get("n_bases")), fmt(p.get("spearman")), fmt(p.get("kendall")),
                            fmt(p.get("p_single_spearman")), fmt(p.get("p_best_of_m_spearman")),
                            fmt(p.get("p_best_of_m_kendall")), fmt(p.get("beats_null_q95"))] for p in pv]))
    if null:
        s.blocks.append(Table(["null: best of M random proxies", "median", "90%", "95%", "mean"],
                              [[stat, fmt(null[stat]["q50"]), fmt(null[stat]["q90"]), fmt(null[stat]["q95"]),
                                fmt(null[stat]["mean"])] for stat in ("spearman", "kendall")]))
    return s


def _confirm_section(conf: dict | None) -> Section:
    s = Section("Confirmation")
    if conf is None:
        s.blocks.append(Para("Not run. `probeselect confirm RUN_DIR --recipe recipes/confirm.yaml --top N` retrains the "
                             "top N pilot bases at the intended budget under the same matching guarantees."))
        return s
    prim = conf["primary"]["metric"]
    cd = conf.get("confirm_decision", {})
    s.blocks.append(Para(f"Recipe `{conf['config'].get('recipe')}` (sha256 `{str(conf.get('recipe_sha256'))[:12]}`), "
                         f"top {conf['config'].get('top')} pilot bases. {conf.get('statement')}"))
    rows = []
    by = {r["base"]: r for r in conf.get("confirm_table", [])}
    for b in conf.get("bases", []):
        r = by.get(b, {})
        rows.append([f"`{b}`", fmt(conf["pilot_values"].get(b)), fmt(conf["confirm_values"].get(b)),
                     f"{fmt(r.get('ci_lo'))} to {fmt(r.get('ci_hi'))}", fmt(r.get("eligible")), fmt(r.get("position"))])
    s.blocks.append(Table(["base", f"pilot {prim}", f"confirmation {prim}", "confirmation interval", "eligible",
                           "confirmation #"], rows))
    rev = conf.get("reversals", [])
    s.blocks.append(Bullets([f"Kendall tau (pilot vs confirmation): {fmt(conf.get('kendall_tau'))}.",
                             f"Confirmation verdict: {str(cd.get('verdict', '?')).replace('_', ' ')}; P(top beats "
                             f"runner-up) {_pct(cd.get('p_top_beats_runner_up'))}."] +
                            ([f"Reversal: `{r['pilot_ahead']}` ahead of `{r['confirm_ahead']}` in the pilot "
                              f"({fmt(r['pilot'][r['pilot_ahead']])} vs {fmt(r['pilot'][r['confirm_ahead']])}) but "
                              f"behind at confirmation ({fmt(r['confirm'][r['pilot_ahead']])} vs "
                              f"{fmt(r['confirm'][r['confirm_ahead']])})." for r in rev] or ["No reversals."]) +
                            [f"Note: {n}" for n in conf.get("notes", [])]))
    return s


def _selection_provenance(run_dir: Path, sel: dict, conf: dict | None, pilot_man: dict | None) -> list[str]:
    lock = sel.get("lock", {})
    items = [f"Selection {sel.get('created_utc')}: status **{sel.get('status')}**; plan `{sel.get('plan_path')}` sha256 "
             f"`{str(sel.get('plan_sha256'))[:16]}`; lock {lock.get('locked_utc')} (plan sha256 at lock "
             f"`{str(lock.get('plan_sha256'))[:16]}`, lock file sha256 `{str(lock.get('sha256'))[:16]}`); outcome files "
             f"present at lock: {len(lock.get('outcome_files_at_lock') or [])}.",
             "Selection inputs: " + ", ".join(f"{k} `{str(v)[:12]}`" for k, v in sel.get("inputs", {}).items() if v) + "."]
    if pilot_man:
        rec = pilot_man.get("recipe")
        rsha = pilot_man.get("recipe_sha256") or (rec.get("sha256") if isinstance(rec, dict) else None)
        items.append(f"Pilot `{run_dir / 'pilot'}`: created {pilot_man.get('created_utc', '?')}, seeds "
                     f"{pilot_man.get('seeds', '?')}, recipe sha256 `{str(rsha)[:16]}`, git "
                     f"`{str((pilot_man.get('git') or {}).get('commit'))[:12]}`.")
    if conf:
        items.append(f"Confirmation {conf.get('created_utc')}: recipe `{conf['config'].get('recipe')}` sha256 "
                     f"`{str(conf.get('recipe_sha256'))[:16]}`; based on selection.json `{str(conf.get('selection_sha256'))[:12]}`.")
    return items


def write_selection_report(run_dir: str | Path, *, averaged_run_dir: str | Path | None = None) -> ReportPaths:
    """Write the base-selection ``report.md`` / ``report.html`` into ``run_dir`` (module docstring)."""
    run_dir = Path(run_dir)
    sel = _read_json(run_dir / "selection.json")
    if sel is None:
        raise SelectionError(f"{run_dir / 'selection.json'}: no selection yet; run `probeselect select {run_dir}`.")
    conf = _read_json(run_dir / "confirm.json")
    if conf and conf.get("selection_sha256") != sha256_file(run_dir / "selection.json"):
        conf = dict(conf, notes=list(conf.get("notes", [])) + [
            "selection.json changed after this confirmation was run; re-run `probeselect confirm`."])
    diag = _read_csv(run_dir / "pilot" / "diagnostics.csv")
    conf_diag = _read_csv(run_dir / "confirm" / "diagnostics.csv") if conf else None
    transfer = _read_csv(run_dir / "pilot" / "transfer.csv")
    pilot_man = _read_json(run_dir / "pilot" / "manifest.json")
    probe = probe_sections(run_dir, averaged_run_dir=averaged_run_dir)
    probe.summary.title = "Probe evidence summary"
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    decision = _decision_section(sel, conf, diag)
    decision.blocks.insert(0, Para(f"Generated {now} from `{run_dir}`. The decision in plain words first; the evidence "
                                   "follows."))
    prov = provenance_section(probe.manifest, run_dir)
    prov.blocks.insert(0, Bullets(_selection_provenance(run_dir, sel, conf, pilot_man)))
    sections = [
        decision,
        _transfer_section(sel, transfer),
        _diagnostics_section(diag, conf_diag),
        _proxy_section(sel),
        _confirm_section(conf),
        probe.summary,
        *probe.evidence,
        Section("Caveats", [Para("What this evidence does not establish:"), Bullets(SELECTION_CAVEATS + CAVEATS)]),
        prov,
    ]
    title = f"probeselect base selection: {run_name(run_dir, probe.manifest)}"
    if sel.get("post_hoc"):
        title = "POST-HOC " + title
    return write_documents(run_dir, title, sections)
