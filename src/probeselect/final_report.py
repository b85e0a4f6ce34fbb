"""The base-selection report: ``report.md`` and a self-contained ``report.html``.

``write_selection_report(run_dir)`` needs ``run_dir/selection.json`` (``probeselect
select``) and uses, when present, ``confirm.json``, ``pilot/diagnostics.csv``,
``confirm/diagnostics.csv`` and ``pilot/manifest.json``. The first screen is a front page
(:mod:`probeselect._front_page`): the decision in two lines, post-SFT transfer per piloted
base and the margin trajectories with the data windows. The Decision section says in plain
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

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from ._io import sha256_file
from .errors import SelectionError
from .metrics import LABELS, RENAMED_METRICS
from ._front_page import front_page
from ._probe_sections import probe_sections
from ._report_blocks import (CAVEATS, Bullets, Para, ReportPaths, Section, Table, fmt, provenance_section, run_name,
                             shown_path, write_documents)

__all__ = ["write_selection_report", "SELECTION_CAVEATS"]

SELECTION_CAVEATS = [
    "The ranking was tested at one post-training budget and recipe. Different learning curves can reverse it at another "
    "SFT/RL budget, data recipe or learning rate; the confirmation checks one larger budget, not every one.",
    "Transfer here means the declared held-out suite (task kinds absent from the SFT data, one prefill-attack analogue, "
    "termination, held-out SFT loss). Robustness measures the evaluated attack setup, not all safety.",
    "Selection on this ladder supports the choice in this tested setting; it does not establish that earlier (or later) "
    "bases generally win, on this ladder's other checkpoints or on another ladder.",
    "With few bases, rank correlations between proxies and transfer are coarse (see the null); a proxy that agrees with "
    "transfer on three bases is weak evidence that it would agree on the next ladder.",
    "Selecting the best proxy after seeing the transfer ranking inflates its correlation: compare it with the best-of-M "
    "null, not with zero. Only a proxy fixed in the locked plan counts as prospective evidence.",
    "The intervals are seed-level paired t intervals: they cover the variation between SFT seeds (each seed's value "
    "averages the evaluated items); they do not cover other recipes, other item suites or systematic errors in the "
    "runs (check the run-correctness table).",
]


_ITEMS_CAVEAT = ("The difference intervals cover the variation between SFT seeds and a new draw of transfer items of "
                 "the same kinds (the plan's `decision.interval: seeds+items`); they do not cover other recipes, other "
                 "task kinds or systematic errors in the runs (check the run-correctness table).")


def _caveats(sel: dict) -> list[str]:
    """SELECTION_CAVEATS, with the interval caveat the plan's ``decision.interval`` makes true."""
    interval = ((sel.get("selection_plan") or {}).get("decision") or {}).get("interval", "seeds")
    if interval != "seeds+items":
        return list(SELECTION_CAVEATS)
    return [_ITEMS_CAVEAT if c.startswith("The intervals are seed-level") else c for c in SELECTION_CAVEATS]


def _pct(x: Any) -> str:
    return "n/a" if x is None else f"{100 * float(x):.0f}%"


def _read_json(p: Path) -> dict | None:
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def _read_csv(p: Path) -> pd.DataFrame | None:
    return pd.read_csv(p) if p.is_file() else None


def _g(x: Any) -> str:
    return fmt(float(x)) if x is not None else "n/a"


class ConfirmationStatus(NamedTuple):
    """How the confirmation bears on the pilot decision (see :func:`confirmation_status`)."""

    status: str  # not_run | nothing_to_confirm | confirmed | default_beaten | replicated | not_confirmed | not_included
    pilot_pick: str | None
    confirm_top: str | None
    confirm_verdict: str | None
    retest_margin: float | None = None  # confirm.json's retest_margin: the pilot's claim re-tested with this margin
    claim: dict | None = None  # confirm.json's claim_retest (a beats_default claim re-tested against the default)
    after_claim: str | None = None  # "default_beaten": confirm.after_default_claim's base
    replication: dict | None = None  # replicate.json (probeselect.replicate) when it re-tested the confirmation's claim

    @property
    def recommended(self) -> str | None:
        """The base the pipeline recommends after the confirmation: the pilot's pick when confirmed; after
        "default_beaten" :func:`probeselect.confirm.after_default_claim` (the pilot's pick, or the confirmation's
        top when the confirmation separates it from the pick by the plan's tie margin); after "replicated" the base
        whose claim the confirmation made and fresh seeds replicated; None otherwise."""
        if self.status == "replicated":
            return (self.replication or {}).get("claim", {}).get("base")
        return {"confirmed": self.pilot_pick, "default_beaten": self.after_claim}.get(self.status)

    def replication_words(self) -> str:
        """'' or the replication's statement (``replicate.json``): whether the confirmation's own claim held on fresh
        SFT seeds, with its numbers."""
        rep = self.replication
        if not rep or not rep.get("needed"):
            return ""
        earlier = rep.get("earlier_attempts") or []
        before = "; ".join(f"seeds {a.get('seeds')}: {'held' if a.get('held') else 'did NOT hold'}" for a in earlier)
        return str(rep.get("statement", "")).rstrip(".") + (
            f" (attempt {len(earlier) + 1}; earlier attempts on other seeds: {before}"
            + ("; a claim that failed once is not counted as replicated)" if any(not a.get("held") for a in earlier)
               else ")") if earlier else "")

    def claim_words(self) -> str:
        """'' or, for "default_beaten", the sentence saying the pilot's claim against the default held, with the
        re-test's difference, interval and margin, and where the confirmation's top lies."""
        c = self.claim
        if self.status != "default_beaten" or not c:
            return ""
        ci = c.get("diff_ci")
        iv = f", interval {_g(ci[0])} to {_g(ci[1])}" if ci else ""
        how = ("; the default fails a selection constraint there, the pick passes" if c.get("default_fails_constraint")
               else "")
        loose = self.retest_margin is not None
        rec = self.recommended
        if rec != self.pilot_pick:
            there = (f"`{rec}` is best there and ahead of the pilot's pick by more than the plan's tie margin "
                     f"({_verdict_words(self.confirm_verdict)}): a result of the confirmation alone, not replicated")
        elif self.confirm_top != self.pilot_pick:
            there = (f"`{self.confirm_top}` is best there ({_verdict_words(self.confirm_verdict)}) but not ahead of "
                     f"the pilot's pick by the plan's tie margin, so the pick stands")
        else:
            there = (f"`{self.pilot_pick}` is best there, though the confirmation names no winner among the bases "
                     f"({_verdict_words(self.confirm_verdict)})")
        return (f"the pilot's claim that `{self.pilot_pick}` beats the default `{c.get('default')}` held at the "
                f"intended budget (difference {_g(c.get('diff'))}{iv}; margin {_g(c.get('margin'))}, one "
                f"pre-specified comparison{how}"
                + ("; re-tested with the plan's confirm_margin: the claim did not reverse, it was not required to "
                   "clear the tie margin again" if loose else "") + f"); {there}")

    def retest_words(self) -> str:
        """'' or ' (re-tested with margin M, the plan's confirm_margin: the claim did not reverse; it did not clear
        the tie margin again)' for a confirmation that ranked with another margin than the pilot."""
        if self.status != "confirmed" or self.retest_margin is None:
            return ""
        return (f" (re-tested with margin {_g(self.retest_margin)}, the plan's confirm_margin: the claim did not "
                "reverse; it was not required to clear the tie margin again)")


_WINNING = ("winner", "single_eligible", "beats_default")


def confirmation_status(sel: dict, conf: dict | None) -> ConfirmationStatus:
    """Whether the confirmation confirms the pilot's pick.

    * ``confirmed``: the pilot named a winner and the confirmation names the *same* base as
      a winner (``winner`` or ``single_eligible``);
    * ``not_confirmed``: the pilot named a winner and the confirmation either puts another
      base on top or has the same base on top without calling it a winner (no clear
      winner): ``confirm.json``'s ``held`` is true in that case, but the report never says
      "held" for a pick that the confirmation does not call a winner;
    * ``default_beaten``: the pilot's verdict was ``beats_default`` (its pick beats the plan's default, e.g.
      the latest checkpoint), it is not ``confirmed``, but ``confirm.json``'s ``claim_retest`` held: the pick
      still beats the default at the intended budget, while the top moved to another base or the confirmation
      separates none. The question the plan asks ("the default, or not?") got the same answer twice;
      :attr:`ConfirmationStatus.recommended` says which base the pipeline then recommends;
    * ``replicated``: the pilot named no winner, or its pick was ``not_confirmed``, the confirmation made a claim
      of its own (``winner`` or ``beats_default``) and ``conf["replication"]`` (``replicate.json``, attached by
      :func:`attach_replication`) held it on fresh SFT seeds: that base is recommended;
    * ``nothing_to_confirm``: the pilot named no winner (whatever the confirmation found);
    * ``not_included``: the pilot's pick was not among the confirmed bases;
    * ``not_run``: no ``confirm.json``.
    """
    cs = _status_before_replication(sel, conf)
    rep = (conf or {}).get("replication")
    if not rep or cs.status not in ("nothing_to_confirm", "not_confirmed"):
        return cs
    claim = rep.get("claim") or {}
    ours = cs.confirm_verdict in ("winner", "beats_default") and claim.get("verdict") == cs.confirm_verdict and \
        claim.get("base") == ((conf.get("confirm_decision") or {}).get("recommended") or cs.confirm_top)
    if not ours:  # a replication of another claim than this confirmation's never decides
        return cs
    # a claim that failed on one set of fresh seeds and held on another is not replicated: retrying until it holds
    # is a search, not a test (replicate.json keeps every attempt)
    failed_before = any(not a.get("held") for a in rep.get("earlier_attempts") or [])
    return cs._replace(status="replicated" if rep.get("held") and not failed_before else cs.status, replication=rep)


def replication_needed(sel: dict, conf: dict | None) -> bool:
    """Whether the pipeline has no recommendation without a replication of the confirmation's own claim: the pilot
    named no winner, or its pick was not confirmed (nor its claim against the default re-established), and the
    confirmation's verdict is ``winner`` or ``beats_default`` (:mod:`probeselect.replicate`)."""
    if not conf:
        return False
    cs = _status_before_replication(sel, conf)
    return cs.status in ("nothing_to_confirm", "not_confirmed") and cs.confirm_verdict in ("winner", "beats_default")


def attach_replication(run_dir: str | Path, conf: dict | None, *, strict: bool = False) -> dict | None:
    """``conf`` (``confirm.json``) with ``replicate.json`` (:mod:`probeselect.replicate`) under ``"replication"`` when
    one exists. A replication made from another ``confirm.json`` never decides: ``strict`` raises; otherwise it is
    left out and ``conf``'s notes say so, with the fix (the report prints them)."""
    p = Path(run_dir) / "replicate.json"
    if conf is None or not p.is_file():
        return conf
    try:
        rep = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SelectionError(f"{p}: not valid JSON ({e}); re-run `probeselect replicate {run_dir}` or delete it.") from e
    sel_p = Path(run_dir) / "selection.json"
    if rep.get("confirm_sha256") != sha256_file(Path(run_dir) / "confirm.json") or (
            sel_p.is_file() and rep.get("selection_sha256") != sha256_file(sel_p)):
        msg = (f"{p}: made from another confirm.json or selection.json than the ones in {run_dir}, so it is not "
               f"used; re-run `probeselect replicate {run_dir}` (or delete {p.name}).")
        if strict:
            raise SelectionError(msg)
        return {**conf, "notes": list(conf.get("notes") or []) + [msg]}
    return {**conf, "replication": rep}


def _status_before_replication(sel: dict, conf: dict | None) -> ConfirmationStatus:
    d = sel.get("decision", {})
    pick = d.get("recommended") or (d.get("top") if d.get("verdict") in _WINNING else None)
    if d.get("verdict") not in _WINNING:
        pick = None
    if conf is None:
        return ConfirmationStatus("not_run", pick, None, None)
    cd = conf.get("confirm_decision") or {}
    ctop, cverdict = cd.get("top"), cd.get("verdict")
    if pick is None:
        return ConfirmationStatus("nothing_to_confirm", None, ctop, cverdict)
    if pick not in (conf.get("bases") or []):
        return ConfirmationStatus("not_included", pick, ctop, cverdict)
    if ctop == pick and cverdict in _WINNING:
        return ConfirmationStatus("confirmed", pick, ctop, cverdict, conf.get("retest_margin"))
    claim = conf.get("claim_retest")
    if d.get("verdict") == "beats_default" and claim and claim.get("held") and claim.get("base") == pick:
        from .confirm import after_default_claim

        rec = after_default_claim(pick, ctop, conf.get("confirm_table") or [], d.get("tie_margin"))
        return ConfirmationStatus("default_beaten", pick, ctop, cverdict, conf.get("retest_margin"), claim, rec)
    return ConfirmationStatus("not_confirmed", pick, ctop, cverdict)


def _seed_counts(sel: dict) -> tuple[int, int | None]:
    """(SFT seeds the decision rests on, the plan's minimum or None for an old run)."""
    d = sel.get("decision", {})
    n = sel.get("n_sft_seeds", d.get("n_sft_seeds"))
    n = int(n) if n is not None else len(d.get("seeds") or [])
    m = sel.get("min_sft_seeds", d.get("min_sft_seeds"))
    if m is None:
        m = (sel.get("selection_plan") or {}).get("min_sft_seeds")
    return n, (int(m) if m is not None else None)


def _verdict_words(v: str | None) -> str:
    return {"winner": "a clear winner", "single_eligible": "the only eligible base",
            "beats_default": "better than the default (the plan's decision.against), with equivalent bases",
            "no_clear_winner":
            "no clear winner", "none_eligible": "no eligible base"}.get(str(v), str(v).replace("_", " "))


_DIAG_EVENTS = (("nonfinite", "nonfinite gradient events"), ("skipped", "skipped steps"), ("spikes", "loss spikes"),
                ("resumes", "resumes"))


def _diag_summary(diag: pd.DataFrame, what: str) -> str:
    """One clause on a diagnostics table: runs, events per kind (naming the runs), clipping."""
    events = []
    for col, words in _DIAG_EVENTS:
        if col not in diag.columns:
            continue
        v = pd.to_numeric(diag[col], errors="coerce").fillna(0)
        bad = diag[v > 0]
        if len(bad):
            who = ", ".join(f"`{r['base']}` seed {fmt(r['seed'])}: {fmt(v[i])}" for i, r in bad.iterrows()
                            if "base" in diag.columns and "seed" in diag.columns)
            events.append(f"{fmt(v.sum())} {words} ({who})" if who else f"{fmt(v.sum())} {words}")
    missing = [c for c, _ in _DIAG_EVENTS if c not in diag.columns]
    txt = f"{len(diag)} {what} runs: " + ("; ".join(events) if events else
                                           "no " + ", ".join(w for c, w in _DIAG_EVENTS if c in diag.columns))
    if missing:
        txt += f" ({', '.join(missing)} not recorded)"
    clip = pd.to_numeric(diag["clip_fraction"], errors="coerce") if "clip_fraction" in diag.columns else None
    if clip is not None and clip.notna().any():
        txt += f"; clipping engaged on {_pct(clip.min())} to {_pct(clip.max())} of steps"
    return txt


def _run_correctness(sel: dict, diag: pd.DataFrame | None, conf_diag: pd.DataFrame | None,
                     rep_diag: pd.DataFrame | None = None) -> list[str]:
    """The top "Run correctness" bullet: the pilot's, the confirmation's and a replication's runs."""
    parts = []
    if diag is not None and len(diag):
        parts.append(_diag_summary(diag, "pilot"))
    elif diag is not None or sel.get("diagnostics_flags"):
        parts.append("pilot runs: no diagnostics recorded")
    if conf_diag is not None and len(conf_diag):
        parts.append(_diag_summary(conf_diag, "confirmation"))
    if rep_diag is not None and len(rep_diag):
        parts.append(_diag_summary(rep_diag, "replication"))
    for b in sel.get("score_nonfinite") or []:  # from the score manifest (probeselect._guards)
        parts.append(f"scored checkpoint `{b.get('checkpoint')}` is invalid: " + " and ".join(
            w for w in ((f"{b.get('n_weights')} weight tensor(s) hold NaN/inf" if b.get("n_weights") else ""),
                        (f"{b.get('nonfinite_scores')} score row(s) are NaN/inf" if b.get("nonfinite_scores") else ""))
            if w))
    if not parts:
        return []
    return ["**Run correctness**: " + ". ".join(parts) + ". Flagged runs are named; check them in the run-correctness "
            "table before trusting their numbers."]


_FLOOR_TOL = 0.01


def floor_ceiling(transfer: pd.DataFrame | None) -> list[dict[str, Any]]:
    """Transfer metrics that cannot separate the piloted bases.

    From ``transfer.csv`` (one row per base x seed x metric): the seed mean of every base.
    A metric is flagged ``identical`` when every base has the same seed mean, ``floor`` /
    ``ceiling`` when it is a rate (:func:`probeselect.metrics.is_rate`) and every base's
    seed mean is within 0.01 of 0 / of 1. Returns ``[{metric, why, values}]``.
    """
    from .metrics import is_rate

    if transfer is None or not len(transfer) or not {"base", "metric", "value"} <= set(transfer.columns):
        return []
    means = transfer.groupby(["metric", "base"])["value"].mean()
    out = []
    for metric in dict.fromkeys(transfer["metric"]):
        v = means.loc[metric].astype(float).dropna()
        if len(v) < 2:
            continue
        why = None
        if is_rate(metric) and (v <= _FLOOR_TOL).all():
            why = "floor"
        elif is_rate(metric) and (v >= 1 - _FLOOR_TOL).all():
            why = "ceiling"
        elif np.ptp(v.to_numpy()) <= 1e-12 * max(1.0, float(v.abs().max())):
            why = "identical"
        if why:
            out.append({"metric": metric, "why": why, "values": v.to_dict()})
    return out


_NAIVE_WORDS = {"latest": "the latest checkpoint", "lowest_bpb": "the lowest pretraining held-out bits per byte"}


def _confirmed_naive(conf: dict) -> dict[str, list[str]]:
    """``confirm.json``'s ``references`` (rule -> checkpoint) as checkpoint -> rules."""
    out: dict[str, list[str]] = {}
    for rule, base in (conf.get("references") or {}).items():
        out.setdefault(str(base), []).append(str(rule))
    return out


def _added_naive(conf: dict) -> str:
    """", plus `b` (the latest checkpoint, a naive choice)" for each naive base retrained beyond the top N."""
    naive = _confirmed_naive(conf)
    top = int(conf.get("config", {}).get("top") or 0)
    return "".join(f", plus `{b}` ({' and '.join(_NAIVE_WORDS.get(r, r) for r in naive[b])}, a naive choice)"
                   for b in (conf.get("bases") or [])[top:] if b in naive)


def _naive_bullet(sel: dict, run_dir: Path, metric: str, level: float, conf: dict | None = None) -> str | None:
    """The naive choices (the latest checkpoint, the lowest pretraining held-out bpb:
    :func:`probeselect.confirm.naive_choices`) against the top base: their piloted transfer and
    difference to the top, or that they were not piloted; and, where the confirmation retrained them
    (``confirm.references``), the same at the confirmation budget against its top."""
    from .confirm import naive_choices

    rule_to_ckpt = {r: c for c, rules in naive_choices(run_dir).items() for r in rules}
    rule_to_ckpt.update((conf or {}).get("references") or {})  # the confirmation's own record wins for its rules
    naive: dict[str, list[str]] = {}
    for r in _NAIVE_WORDS:
        if r in rule_to_ckpt:
            naive.setdefault(str(rule_to_ckpt[r]), []).append(r)
    if not naive:
        return None
    bases = {b["base"]: b for b in sel["bases"]}
    top = sel["decision"].get("top")
    conf_rows = {r["base"]: r for r in (conf or {}).get("confirm_table") or []}
    conf_top = ((conf or {}).get("confirm_decision") or {}).get("top")
    parts, unconfirmed = [], []
    for c, rules in naive.items():
        who = f"`{c}` ({' and '.join(_NAIVE_WORDS[r] for r in rules)})"
        b = bases.get(c)
        n = conf_rows.get(c)
        if b is None and n is not None:
            part = f"{who} was not piloted"
        elif b is None:
            part = (f"{who} was not piloted, so its transfer is unknown (the plan's `references: [latest, "
                    "lowest_bpb]` pilots it next to the shortlist)")
        elif c == top:
            part = f"{who} is the top base ({metric} {_g(b.get('value'))})"
        else:
            d = (f"; the top `{top}` is ahead of it by {_g(b.get('diff_vs_top'))} ({_pct(level)} interval "
                 f"{_g(b.get('diff_vs_top_lo'))} to {_g(b.get('diff_vs_top_hi'))}; an interval reaching below 0 does "
                 "not rule out the naive choice)" if b.get("diff_vs_top") is not None else "")
            part = (f"{who} has {metric} {_g(b.get('value'))} ({_pct(level)} interval {_g(b.get('ci_lo'))} to "
                    f"{_g(b.get('ci_hi'))}){d}")
        if n is not None:
            at = (f"at the confirmation budget it has {_g(n.get('value'))} ({_pct(level)} interval {_g(n.get('ci_lo'))} "
                  f"to {_g(n.get('ci_hi'))})")
            if c == conf_top:
                at += ", the best of the confirmed bases"
            elif n.get("diff_vs_top") is not None:
                lo, hi = n.get("diff_vs_top_lo"), n.get("diff_vs_top_hi")
                iv = ("no interval: one SFT seed" if lo is None or hi is None else
                      f"{_pct(level)} interval {_g(lo)} to {_g(hi)}"
                      + ("; it reaches below 0, so the naive choice is not ruled out" if lo < 0 else ""))
                at += f" and the confirmation's top `{conf_top}` is ahead of it by {_g(n.get('diff_vs_top'))} ({iv})"
            elif n.get("eligible") is False:
                at += ", failing a constraint"
            part += "; " + at
        elif conf is not None:
            unconfirmed.append(c)
        parts.append(part)
    if unconfirmed:
        parts.append(f"the confirmation did not retrain {', '.join(f'`{c}`' for c in unconfirmed)} "
                     "(`confirm.references: [latest, lowest_bpb]` in the run config, or `probeselect confirm "
                     "--references latest lowest_bpb`, retrains the naive choices at the intended budget)")
    return "**Against the naive choices**: " + "; ".join(parts) + "."


def _floor_ceiling_bullets(transfer: pd.DataFrame | None, sel: dict) -> list[str]:
    flags = floor_ceiling(transfer)
    if not flags:
        return []
    plan = sel.get("selection_plan", {})
    primary = (plan.get("primary") or {}).get("metric")
    constrained = {c.get("metric") for c in plan.get("constraints", [])}
    words = {"floor": "at the floor for every base (seed means {v}; all within 0.01 of 0)",
             "ceiling": "at the ceiling for every base (seed means {v}; all within 0.01 of 1)",
             "identical": "identical for every base ({v})"}
    parts = []
    for f in flags:
        role = (" -- the primary metric" if f["metric"] == primary else
                " -- its constraint cannot exclude or separate any base" if f["metric"] in constrained else "")
        vals = ", ".join(fmt(x) for x in f["values"].values())
        parts.append(f"`{f['metric']}` is {words[f['why']].format(v=vals)}{role}")
    return ["**Metrics that cannot separate bases**: " + "; ".join(parts) + ". Differences on these metrics carry no "
            "evidence; make the transfer suite harder (or easier) where they sit."]


def _confirm_command(run_dir: Path, top) -> str:
    """The confirm command for this run: its pilot recipe at the intended budget (never the toy's
    recipes/confirm.yaml unless this run's pilot used the toy recipe)."""
    man = _read_json(run_dir / "pilot" / "manifest.json") or {}
    src = str(man.get("recipe_source") or "").split(" (with overrides")[0]
    cmd = f"`probeselect confirm RUN_DIR --recipe CONFIRM_RECIPE --top {top}`"
    if not src:
        return cmd + ", CONFIRM_RECIPE being the pilot recipe at the intended budget"
    return (cmd + f", CONFIRM_RECIPE being this run's pilot recipe `{shown_path(src, run_dir)}` at the intended budget "
            "(e.g. a copy with a larger `budget:`)")


def _confirmation_bullet(conf: dict | None, cs: ConfirmationStatus, run_dir: Path) -> str:
    """The Decision section's confirmation bullet: what the confirmation (and a replication) says of the pick."""
    if conf is None:
        return ("**Confirmation**: not run. Confirm at the intended budget before committing "
                f"({_confirm_command(run_dir, 2)}).")
    rep_words = cs.replication_words()
    rep = f" {rep_words}." if rep_words else ""
    tail = (f" Kendall tau between pilot and confirmation rankings of {len(conf.get('pilot_values') or {})} bases: "
            f"{_g(conf.get('kendall_tau'))}; {len(conf.get('reversals', []))} reversal(s).")
    there = f"at the confirmation budget `{cs.confirm_top or 'no base'}` is best ({_verdict_words(cs.confirm_verdict)})"
    if cs.status == "confirmed":
        return f"**Confirmation confirms `{cs.pilot_pick}`**: {there}{cs.retest_words()}." + tail
    if cs.status == "replicated":
        return f"**Confirmation's own claim replicated**: {there}. {rep_words}." + tail
    if cs.status == "default_beaten":
        return f"**Confirmation confirms the claim against the default**: {cs.claim_words()}." + tail
    if cs.status == "not_confirmed":
        return f"**Confirmation does not confirm `{cs.pilot_pick}`**: {there}.{rep}" + tail
    if cs.status == "not_included":
        return f"**Confirmation did not include the pilot pick `{cs.pilot_pick}`**: {there}." + tail
    new = (" A winner found only at the confirmation budget is a new, unreplicated result."
           if cs.confirm_verdict in _WINNING else "")
    return (f"**Confirmation** (the pilot named no winner, so there was no pick to confirm): {there}.{rep or new}"
            + tail)


def _decision_section(sel: dict, conf: dict | None, diag: pd.DataFrame | None,
                      conf_diag: pd.DataFrame | None = None, transfer: pd.DataFrame | None = None,
                      run_dir: Path = Path("."), rep_diag: pd.DataFrame | None = None) -> Section:
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
        r = bases.get(b, {})
        return f"{_g(r.get('value'))} ({_pct(level)} interval {_g(r.get('ci_lo'))} to {_g(r.get('ci_hi'))})"

    n_seeds, min_seeds = _seed_counts(sel)
    few = min_seeds is not None and n_seeds < min_seeds
    n_items = d.get("n_items")
    scope = f"over {n_seeds} SFT seed{'s' if n_seeds != 1 else ''} x {n_items} held-out items"
    few_txt = f" (provisional: {n_seeds} of the {min_seeds} SFT seeds the plan requires)" if few else ""
    verdict = d["verdict"]
    cs = confirmation_status(sel, conf)
    # The headline: the pilot's verdict as qualified by the confirmation, so the top lines never contradict.
    rep_words = cs.replication_words()
    if cs.status == "replicated":
        items.append(f"**Recommended base: `{cs.recommended}`**. The pilot "
                     + (f"recommended `{top}`, which the confirmation did not confirm" if cs.pilot_pick else
                        f"named no winner ({_verdict_words(verdict)})")
                     + f"; the confirmation at the intended budget names `{cs.recommended}` "
                     f"{_verdict_words(cs.confirm_verdict)}, and that claim was re-tested. {rep_words}.")
    elif verdict in _WINNING:
        why = (f"It has the best {metric} ({direction} is better) among the bases that pass the transfer constraints"
               if verdict == "winner" else
               f"It beats the default `{d.get('default')}` ({d.get('against')}) by more than the tie margin on {metric}, "
               f"though not every other base ({d.get('reason')})" if verdict == "beats_default" else
               "It is the only base that passes the transfer constraints (no comparison)")
        if cs.status == "confirmed":
            items.append(f"**Recommended base: `{top}`**{few_txt}. {why}, and the confirmation at the intended budget "
                         f"names it {_verdict_words(cs.confirm_verdict)} too{cs.retest_words()}.")
        elif cs.status == "default_beaten":
            held = cs.claim_words()
            items.append(f"**Recommended base: `{cs.recommended}`**{few_txt}, not the default. In the pilot `{top}` "
                         f"was recommended: {why[:1].lower()}{why[1:]}. {held[:1].upper()}{held[1:]}.")
        elif cs.status == "not_run":
            items.append(f"**Recommended base (pilot only, not yet confirmed): `{top}`**{few_txt}. {why}.")
        elif cs.status == "not_included":
            items.append(f"**Pilot pick `{top}` not confirmed**{few_txt}: the confirmation did not retrain it. {why} "
                         "in the pilot only.")
        else:
            there = (f"it is still the best there but not a clear winner ({_verdict_words(cs.confirm_verdict)})"
                     if cs.confirm_top == top else
                     f"`{cs.confirm_top or 'no base'}` is best there ({_verdict_words(cs.confirm_verdict)})")
            items.append(f"**Pilot pick `{top}` not confirmed**{few_txt}: at the confirmation budget {there}. "
                         + (f"{rep_words}. " if rep_words else "")
                         + "No recommendation stands; run more seeds or decide on other grounds.")
    elif verdict == "no_clear_winner":
        reason = d.get("reason")
        items.append(f"**No clear winner** between `{top}` and `{ru}`" +
                     (f": {reason}" if reason else f": the interval of their {metric} difference reaches into the tie "
                      f"margin ({_g(d.get('tie_margin'))})") +
                     ". " + (f"{rep_words}. " if rep_words else "")
                     + "Pick on other grounds (cost, the confirmation run) or run more seeds/items.")
    else:
        items.append("**No recommendation**: no piloted base passes the transfer constraints (table below).")
    if few and cs.status == "replicated":  # the replication trains at least min_sft_seeds (probeselect.replicate)
        items.append(f"**Too few SFT seeds in the pilot**: {n_seeds} of the {min_seeds} the plan requires "
                     "(`selection.min_sft_seeds`); the recommendation rests on the confirmation and its replication "
                     f"(at least {min_seeds} seeds), not on the pilot.")
    elif few:
        items.append(f"**Too few SFT seeds**: this decision rests on {n_seeds} SFT seed{'s' if n_seeds != 1 else ''}; "
                     f"the plan requires at least {min_seeds} (`selection.min_sft_seeds`). Re-run the pilot with more "
                     "seeds before acting on it.")
    if top and ru:
        ci = d.get("diff_ci") or [None, None]
        how = (f"**How sure{' (the pilot)' if cs.status == 'replicated' else ''}**: {metric} of `{top}` {val(top)} vs "
               f"runner-up `{ru}` {val(ru)}, {scope}. Difference "
               f"{_g(d.get('diff'))} ({_pct(level)} interval {_g(ci[0])} to {_g(ci[1])}"
               + f", {d.get('interval') or 'paired bootstrap over items and seeds'}; tie margin {_g(d.get('tie_margin'))})")
        if d.get("p_top_beats_runner_up") is not None:
            how += f"; `{top}` beats `{ru}` in {_pct(d.get('p_top_beats_runner_up'))} of resampled replicates"
        dci = d.get("diff_vs_default_ci")
        if d.get("against") and d.get("default") not in (None, top) and dci:
            how += (f"; against the default `{d['default']}` ({d['against']}, the plan's `decision.against`): difference "
                    f"{_g(d.get('diff_vs_default'))} ({_pct(level)} interval {_g(dci[0])} to {_g(dci[1])}, same level)")
        items.append(how + ".")
    elif top:
        items.append(f"**How sure**: {metric} of `{top}` {val(top)}, {scope}.")
    if not sel.get("post_hoc"):
        items.append(f"**Predeclared**: the plan `{shown_path(sel.get('plan_path'), run_dir)}` (sha256 "
                     f"`{str(sel.get('plan_sha256'))[:12]}`) was locked (time in `plan.lock.json`) before any pilot or "
                     "transfer result existed, and is unchanged since.")
    items.append(_confirmation_bullet(conf, cs, run_dir))
    naive = _naive_bullet(sel, run_dir, metric, level, conf)
    if naive:
        items.append(naive)
    items.extend(_run_correctness(sel, diag, conf_diag, rep_diag))
    items.extend(_floor_ceiling_bullets(transfer, sel))
    items.extend(_probes_vs_pilot_bullets(sel, run_dir))
    return Section("Decision", [Bullets(items)])


def _probes_vs_pilot_bullets(sel: dict, run_dir: Path) -> list[str]:
    """Did the probes predict the pilot? First the predeclared shortlist aggregate (the order the pipeline
    acted on) against pilot transfer, with the place of the probes' first choice in the pilot and what a random
    order of the same bases would give; then the best-agreeing single proxy, whose choice after the fact is
    discounted by the best-of-M null. A proxy picked because it agreed is not evidence, so the aggregate leads."""
    pv = [p for p in sel.get("proxy_validation", []) if p.get("spearman") is not None]
    null = sel.get("null") or {}
    if not pv or not null:
        return []
    out = []
    from .select import AGGREGATE_PROXY

    agg = next((p for p in pv if str(p.get("proxy", "")).startswith(AGGREGATE_PROXY)), None)
    if agg is not None:
        rho, p1 = agg["spearman"], agg.get("p_single_spearman")
        words = (f"**Probes vs the pilot**: the predeclared {agg['proxy']} orders the {agg['n_bases']} piloted bases "
                 f"with Spearman {_g(rho)} against pilot transfer (a random order does as well or better with "
                 f"probability {_g(p1)})")
        first = _probes_first_choice(run_dir)
        pos = {b["base"]: b.get("position") for b in sel.get("bases", [])}
        if first and pos.get(first) is not None:
            words += f"; the probes' first choice `{first}` is #{pos[first]} of {len(pos)} in the pilot"
        if rho is not None and rho <= 0:
            words += (". On this run the probes' order did not predict transfer: the recommendation rests on the "
                      "pilot, not on the probes")
        elif p1 is not None and p1 > 0.05:
            words += (f". With {agg['n_bases']} bases this agreement is within what a random order gives: it "
                      "neither supports nor refutes the probes")
        out.append(words + ".")
    single = [p for p in pv if p is not agg]
    if single:
        best = max(single, key=lambda p: p["spearman"])
        out.append(f"**Proxies**: the best-agreeing predeclared proxy `{best['proxy']}` has Spearman "
                   f"{_g(best['spearman'])} with transfer over {best['n_bases']} bases; the best of "
                   f"{null.get('m_random_proxies')} random proxies has median {_g(null['spearman']['q50'])} and 95th "
                   f"percentile {_g(null['spearman']['q95'])} (chance of matching or beating "
                   f"{_g(best['spearman'])}: {_g(best['p_best_of_m_spearman'])} when picking the best proxy after the "
                   f"fact, {_g(best['p_single_spearman'])} for one proxy fixed in advance).")
    return out


def _probes_first_choice(run_dir: Path) -> str | None:
    """The shortlist's rank 1 (``shortlist.json``), or None where the run has no readable shortlist."""
    try:
        sl = json.loads((Path(run_dir) / "shortlist.json").read_text(encoding="utf-8"))
        first = min(sl.get("selected") or [], key=lambda r: r.get("position", 0), default=None)
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return str(first["checkpoint"]) if first and first.get("checkpoint") else None


def _transfer_section(sel: dict, transfer: pd.DataFrame | None) -> Section:
    s = Section("Pilot transfer")
    prim = sel["selection_plan"]["primary"]
    cons = sel["selection_plan"]["constraints"]
    seeds = sel["decision"].get("seeds", [])
    boot = sel.get("bootstrap") or {}
    d = sel["decision"]
    if d.get("interval"):  # the method selection.json names
        how = (f"interval = {_pct(d.get('level', boot.get('level', 0.95)))} {d['interval']}; p best = share of "
               "resampled draws in which the base is the best eligible one")
    else:
        how = (f"interval = {_pct(boot.get('level', 0.95))} paired bootstrap over items and seeds "
               f"({boot.get('replicates', '?')} replicates, numpy seed {boot.get('seed', '?')}); p best = share of "
               "replicates in which the base is the best eligible one")
    s.blocks.append(Para(
        f"Primary metric `{prim['metric']}` ({prim['direction']} is better), averaged over SFT seeds {seeds}; {how}. "
        "Constraints: " + (", ".join(
            f"`{c['metric']}`" + (f" >= {c['min']:g}" if c.get("min") is not None else "") +
            (f" <= {c['max']:g}" if c.get("max") is not None else "") for c in cons) or "none") +
        f". Decision rule: clear winner when the lower end of the top-vs-runner-up interval exceeds the tie margin "
        f"{d.get('tie_margin')}."))
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
        s.blocks.append(Para("Every transfer metric per pilot run (`transfer.csv`). `heldout_loss` and "
                             "`sft_heldout_bpb` are on the held-out **SFT** rows (nats per response token and bits per "
                             "byte, token/byte weighted), not the pretraining held-out text whose bits per byte the "
                             "probe sections show (`heldout_nll/bpb`)."))
        s.blocks.append(Table(["base", "seed", *[LABELS.get(m, m) for m in metrics]],
                              [[str(r["base"]), fmt(r["seed"]), *[fmt(r[m]) for m in metrics]]
                               for _, r in wide.iterrows()]))
    if sel.get("notes"):
        s.blocks.append(Bullets([f"Note: {n}" for n in sel["notes"]]))
    return s


# No wall-clock columns (seconds, tokens_per_s): the report is the same for two runs that decide the same thing;
# throughput stays in diagnostics.csv.
_DIAG_COLS = ["base", "seed", "steps", "sup_tokens", "clip_fraction", "grad_norm_p50", "grad_norm_p90", "grad_norm_max",
              "nonfinite", "skipped", "spikes", "resumes"]


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


_STATUS_WORDS = {
    "confirmed": "The confirmation confirms the pilot pick `{pick}`: the same base is {cv} at the intended budget.",
    "not_confirmed": "The pilot pick `{pick}` is not confirmed: at the intended budget `{top}` is best ({cv}).",
    "default_beaten": "The confirmation confirms the pilot's claim against the default: {claim}.",
    "replicated": "The confirmation names `{top}` {cv}, a claim of its own (the pilot did not make it). {rep}.",
    "not_included": "The pilot pick `{pick}` was not among the confirmed bases.",
    "nothing_to_confirm": "The pilot named no winner, so there was no pick to confirm; at the intended budget `{top}` is "
                          "best ({cv}).",
}


def _margin_words(conf: dict, sel: dict | None) -> str:
    """' (tie margin M, not the pilot's P: ...)' when the confirmation re-tested the pilot's claim with the plan's
    confirm_margin (confirm.json's retest_margin); '' otherwise."""
    m, pm = conf.get("retest_margin"), ((sel or {}).get("decision") or {}).get("tie_margin")
    if m is None:
        return ""
    return (f" (tie margin {_g(m)}, not the pilot's {_g(pm)}: the plan's confirm_margin re-tests the pilot's claim, "
            "which must not reverse)")


def _confirm_section(conf: dict | None, sel: dict | None = None, run_dir: Path = Path(".")) -> Section:
    s = Section("Confirmation")
    if conf is None:
        s.blocks.append(Para(f"Not run. {_confirm_command(run_dir, 'N')} retrains the "
                             "top N pilot bases at the intended budget under the same matching guarantees."))
        return s
    prim = conf["primary"]["metric"]
    cd = conf.get("confirm_decision", {})
    cs = confirmation_status(sel or {}, conf)
    said = _STATUS_WORDS.get(cs.status, "{top}").replace(" at the intended budget.", " at the intended budget"
                                                         + cs.retest_words() + ".").format(pick=cs.pilot_pick, top=cs.confirm_top or "no base",
                                                        cv=_verdict_words(cs.confirm_verdict), claim=cs.claim_words(),
                                                        rep=cs.replication_words())
    if cs.status != "replicated" and cs.replication_words():
        said += f" {cs.replication_words()}."
    elif cs.status != "replicated" and (conf.get("replication") or {}).get("needed") is False:
        said += f" {conf['replication'].get('statement', '')}"

    recipe = shown_path(conf["config"].get("recipe"), run_dir)
    s.blocks.append(Para(f"Recipe `{recipe}` (sha256 `{str(conf.get('recipe_sha256'))[:12]}`), "
                         f"top {conf['config'].get('top')} pilot bases{_added_naive(conf)}. {said}"))
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
                             f"Confirmation verdict: {str(cd.get('verdict', '?')).replace('_', ' ')}"
                             f"{_margin_words(conf, sel)}; P(top beats "
                             f"runner-up) {_pct(cd.get('p_top_beats_runner_up'))}."] +
                            ([f"Reversal: `{r['pilot_ahead']}` ahead of `{r['confirm_ahead']}` in the pilot "
                              f"({fmt(r['pilot'][r['pilot_ahead']])} vs {fmt(r['pilot'][r['confirm_ahead']])}) but "
                              f"behind at confirmation ({fmt(r['confirm'][r['pilot_ahead']])} vs "
                              f"{fmt(r['confirm'][r['confirm_ahead']])})." for r in rev] or ["No reversals."]) +
                            [f"Note: {n}" for n in conf.get("notes", [])]))
    return s


def _leakage_lines(rec: dict) -> list[str]:
    """What the pilot's leakage guards checked, and how close the transfer tasks are to the probes' form."""
    if "transfer_tasks" not in rec:
        return []
    n, k = rec["transfer_tasks"], rec.get("probe_template_tasks", 0)
    probes = rec.get("probe_items") or []
    out = [f"Transfer leakage guards: {n} transfer task(s) share no prompt (whole prompt or last line) with "
           + (f"{len(probes)} probe item file(s) ({rec.get('probe_items_source')})" if probes
              else "any probe item file (none was found to check against)")
           + "; their kinds are absent from the SFT data."]
    if k:
        ex = "; ".join(f"`{i}` ({f})" for i, f, _ in rec.get("probe_template_examples") or [])
        out.append(f"**{k} of {n} transfer task(s) are written in a built-in probe family's own surface form** "
                   f"(e.g. {ex}): on those, post-SFT transfer partly re-scores the probe, so agreement between "
                   "probes and transfer is weaker evidence.")
    else:
        out.append(f"0 of {n} transfer tasks are written in a built-in probe family's surface form "
                   "(`probeselect.transfer.probe_template_matches`).")
    return out


def _selection_provenance(run_dir: Path, sel: dict, conf: dict | None, pilot_man: dict | None) -> list[str]:
    """Hashes of the inputs that decide; no times and no hashes of files that hold times (those stay in
    ``selection.json``, ``plan.lock.json`` and the manifests), so the report is the same for two runs that decide
    the same thing."""
    lock = sel.get("lock", {})
    items = [f"Selection status **{sel.get('status')}**; plan `{shown_path(sel.get('plan_path'), run_dir)}` sha256 "
             f"`{str(sel.get('plan_sha256'))[:16]}` (plan sha256 at lock `{str(lock.get('plan_sha256'))[:16]}`); "
             f"outcome files present at lock: {len(lock.get('outcome_files_at_lock') or [])}. Times and the hashes "
             "of the input tables: `selection.json` and `plan.lock.json`."]
    if pilot_man:
        rec = pilot_man.get("recipe")
        rsha = pilot_man.get("recipe_sha256") or (rec.get("sha256") if isinstance(rec, dict) else None)
        items.append(f"Pilot `pilot/`: seeds {pilot_man.get('seeds', '?')}, recipe sha256 `{str(rsha)[:16]}`, git "
                     f"`{str((pilot_man.get('git') or {}).get('commit'))[:12]}` (times: `pilot/manifest.json`).")
        items.extend(_leakage_lines(pilot_man.get("leakage_check") or {}))
    if conf:
        items.append(f"Confirmation: recipe `{shown_path(conf['config'].get('recipe'), run_dir)}` sha256 "
                     f"`{str(conf.get('recipe_sha256'))[:16]}` (times: `confirm.json`).")
    return items


def _sft_lift_section(run_dir: Path) -> Section | None:
    """Transfer of each piloted base before SFT (``pilot/transfer_base.csv``) and after it (mean over SFT
    seeds of ``pilot/transfer.csv``), per metric and, for task accuracy, per task kind."""
    before = _read_csv(run_dir / "pilot" / "transfer_base.csv")
    after = _read_csv(run_dir / "pilot" / "transfer.csv")
    if before is None or after is None or before.empty:
        return None
    a = after.groupby(["base", "metric"])["value"].agg(["mean", "std", "count"]).reset_index()
    m = before[["base", "metric", "value"]].merge(a, on=["base", "metric"], how="inner")
    m["lift"] = m["mean"] - m["value"]
    rows = [[str(r.base), str(r.metric), _g(r.value), _g(r.mean), _g(r.std), str(int(r.count)), _g(r.lift)]
            for r in m.itertuples()]
    blocks: list = [Para("The same transfer harness (prompts, decoding, items) run on each base before SFT and after "
                         "the matched pilot SFT; after = mean over SFT seeds (sd = their standard deviation); lift = "
                         "after - before."),
                    Table(["base", "metric", "before SFT", "after SFT", "SFT-seed sd", "seeds", "lift"], rows)]
    items = run_dir / "pilot" / "transfer_items.parquet"
    if items.is_file():
        it = pd.read_parquet(items)
        acc = it[it["metric"] == "task_accuracy"]
        if len(acc):
            per = acc.groupby(["base", "kind", "seed"])["value"].mean().groupby(["base", "kind"]).agg(["mean", "std"])
            blocks += [Para("Task accuracy after SFT per task kind (mean and sd over SFT seeds):"),
                       Table(["base", "kind", "accuracy", "SFT-seed sd"],
                             [[str(b), str(k), _g(r["mean"]), _g(r["std"])] for (b, k), r in per.iterrows()])]
    return Section("SFT lift", blocks)


def write_selection_report(run_dir: str | Path, *, averaged_run_dir: str | Path | None = None) -> ReportPaths:
    """Write the base-selection ``report.md`` / ``report.html`` into ``run_dir`` (module docstring)."""
    run_dir = Path(run_dir)
    sel = _read_json(run_dir / "selection.json")
    if sel is None:
        raise SelectionError(f"{run_dir / 'selection.json'}: no selection yet; run `probeselect select {run_dir}`.")
    from ._live_selection import live_selection

    sel = live_selection(run_dir, sel)  # POST-HOC/predeclared from the lock and plan as they are now
    conf = attach_replication(run_dir, _read_json(run_dir / "confirm.json"))
    if conf and conf.get("selection_sha256") != sha256_file(run_dir / "selection.json"):
        conf = dict(conf, notes=list(conf.get("notes", [])) + [
            "selection.json changed after this confirmation was run; re-run `probeselect confirm`."])
    diag = _read_csv(run_dir / "pilot" / "diagnostics.csv")
    conf_diag = _read_csv(run_dir / "confirm" / "diagnostics.csv") if conf else None
    transfer = _read_csv(run_dir / "pilot" / "transfer.csv")
    if transfer is not None and "metric" in transfer.columns:  # runs from before a metric was renamed
        transfer["metric"] = transfer["metric"].replace(RENAMED_METRICS)
    pilot_man = _read_json(run_dir / "pilot" / "manifest.json")
    probe = probe_sections(run_dir, averaged_run_dir=averaged_run_dir)
    probe.summary.title = "Probe evidence summary"
    rep_out = ((conf or {}).get("replication") or {}).get("out_dir")
    rep_diag = _read_csv(Path(rep_out) / "diagnostics.csv") if rep_out else None
    decision = _decision_section(sel, conf, diag, conf_diag, transfer, run_dir, rep_diag)
    decision.blocks.insert(0, Para("The decision in plain words first; the evidence follows."))
    prov = provenance_section(probe.manifest, run_dir)
    prov.blocks.insert(0, Bullets(_selection_provenance(run_dir, sel, conf, pilot_man)))
    front = front_page(run_dir, sel, confirmation_status(sel, conf), _seed_counts(sel), probe.manifest,
                       lambda p: shown_path(p, run_dir))
    sections = [
        front,
        decision,
        _transfer_section(sel, transfer),
        *([lift] if (lift := _sft_lift_section(run_dir)) is not None else []),
        _diagnostics_section(diag, conf_diag),
        _proxy_section(sel),
        _confirm_section(conf, sel, run_dir),
        probe.summary,
        *probe.evidence,
        Section("Caveats", [Para("What this evidence does not establish:"), Bullets(_caveats(sel) + CAVEATS)]),
        prov,
    ]
    title = f"probeselect base selection: {run_name(run_dir, probe.manifest)}"
    if sel.get("post_hoc"):
        title = "POST-HOC " + title
    return write_documents(run_dir, title, sections)
