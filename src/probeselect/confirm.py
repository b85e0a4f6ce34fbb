"""Confirm a pilot selection at the intended, larger post-training budget.

``confirm(run_dir, recipe, top=N)`` takes the top N bases of ``run_dir/selection.json``
(the pilot ranking: eligible bases by primary value, then the rest), trains them again
with :func:`probeselect.pilot.run_pilot` under ``recipe`` (same matching guarantees:
one data manifest per seed for every base) into ``run_dir/confirm/``, ranks them with the
same plan (primary metric, constraints, bootstrap, tie margin) and writes
``run_dir/confirm.json``:

* ``kendall_tau``: Kendall tau-b between the pilot and confirmation values of the N bases
  (primary metric, oriented so higher = better; +1 = same order);
* ``reversals``: every pair whose order flipped, named with both values at both budgets;
* ``held``: whether the pilot decision held: the pilot's recommended base is also the
  best eligible base at confirmation. ``None`` when the pilot named no winner.
* ``claim_retest`` (only after a pilot verdict ``beats_default``): that verdict claims "the recommended
  base beats the plan's default" (e.g. the latest checkpoint), not "it is the best base", so the claim
  is re-tested as made: the recommended base against the default alone, at the confirmation budget,
  under the confirmation's margin and constraints (:func:`retest_against_default`). One comparison
  fixed before the confirmation's data, so no Bonferroni. ``held`` there is true when the interval
  lies above the margin (or the default fails a constraint the recommended base passes); the top may
  still move to another confirmed base (``probeselect.final_report.confirmation_status``:
  "default_beaten"). The report then recommends the pilot's pick, or the confirmation's top when the
  confirmation separates it from the pick by the plan's tie margin (:func:`after_default_claim`).

``references=("latest", "lowest_bpb")`` also retrains the naive choices (the ladder's latest
checkpoint, the one of lowest pretraining held-out bits per byte: :func:`naive_choices`, the same
checkpoints the report names "against the naive choices") when they are not among the top N, under
the same recipe and data manifests, and ranks them with the rest: the confirmation then says
whether the pick beats "post-train the latest checkpoint" at the intended budget, which a pilot
that did not train the latest (or trained it at the pilot budget only) cannot. ``confirm.json``
records ``references`` (rule -> checkpoint) and ``naive`` (each naive base's value, interval and
difference to the confirmation's top, with its interval).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ._io import atomic_write_json, canonical_json_hash, sha256_file
from .dynamics import naive_choices
from .errors import SelectionError
from .manifest import base_manifest
from .plan import REFERENCES, SelectionSpec, selection_spec_from_dict
from .select import PilotTables, Ranking, load_pilot_tables, rank_bases, records

__all__ = ["ConfirmResult", "confirm", "compare_rankings", "base_paths", "naive_choices", "valid_references",
           "retest_against_default", "after_default_claim"]


@dataclass
class ConfirmResult:
    ranking: Ranking
    kendall_tau: float | None
    reversals: list[dict[str, Any]]
    held: bool | None
    statement: str
    record: dict[str, Any]
    json_path: Path


def _load_pilot_fn() -> Callable[..., Any]:
    try:
        from .pilot import run_pilot
    except ImportError as exc:
        raise SelectionError(f"probeselect.pilot is not available ({exc}); the confirmation needs the pilot runner.") from None
    return run_pilot


def base_paths(run_dir: Path, names: Sequence[str]) -> list[Path]:
    """Checkpoint folders of ``names``: from the score manifest, else the pilot manifest."""
    found: dict[str, Path] = {}
    man = run_dir / "manifest.json"
    if man.is_file():
        for c in json.loads(man.read_text(encoding="utf-8")).get("checkpoints", []):
            if c.get("name") and c.get("path"):
                found[str(c["name"])] = Path(c["path"])
    pman = run_dir / "pilot" / "manifest.json"
    if pman.is_file():
        bases = json.loads(pman.read_text(encoding="utf-8")).get("bases", [])
        for b in bases if isinstance(bases, list) else []:
            if isinstance(b, dict) and b.get("path"):
                found.setdefault(str(b.get("name") or Path(b["path"]).name), Path(b["path"]))
    missing = [n for n in names if n not in found]
    if missing:
        raise SelectionError(f"{run_dir}: cannot find the checkpoint folder of {missing[0]!r} in manifest.json or "
                             "pilot/manifest.json; re-score the ladder or pass base paths.")
    return [found[n] for n in names]


def valid_references(refs: Any) -> bool:
    """Whether ``refs`` is a list of distinct rules of :data:`probeselect.plan.REFERENCES`."""
    return isinstance(refs, list) and all(r in REFERENCES for r in refs) and len(set(refs)) == len(refs)


def _naive_rows(table: list[dict[str, Any]], refs: dict[str, list[str]], top: str | None) -> list[dict[str, Any]]:
    """Per confirmed naive base: its rules, value and interval, and the difference of the
    confirmation's top to it with its interval (None for the top itself)."""
    rows = {r["base"]: r for r in table}
    out = []
    for base, rules in refs.items():
        r = rows.get(base)
        if r is None:
            continue
        out.append({"base": base, "rules": rules, "is_top": base == top, "eligible": r.get("eligible"),
                    "value": r.get("value"),
                    "ci_lo": r.get("ci_lo"), "ci_hi": r.get("ci_hi"),
                    **{k: (None if base == top else r.get(k)) for k in ("diff_vs_top", "diff_vs_top_lo",
                                                                       "diff_vs_top_hi")}})
    return out


def compare_rankings(pilot: dict[str, float], confirm: dict[str, float], direction: str
                     ) -> tuple[float | None, list[dict[str, Any]]]:
    """Kendall tau-b of the two value sets (oriented) and every reversed pair, pilot order first."""
    from scipy.stats import kendalltau

    sign = 1.0 if direction == "higher" else -1.0
    names = sorted(pilot, key=lambda b: -sign * pilot[b])
    p = np.array([sign * pilot[b] for b in names])
    c = np.array([sign * confirm[b] for b in names])
    tau = None
    if len(names) >= 2 and np.ptp(p) > 0 and np.ptp(c) > 0:
        tau = float(kendalltau(p, c).statistic)
    rev = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if sign * pilot[a] > sign * pilot[b] and sign * confirm[a] < sign * confirm[b]:
                rev.append({"pilot_ahead": a, "confirm_ahead": b, "pilot": {a: pilot[a], b: pilot[b]},
                            "confirm": {a: confirm[a], b: confirm[b]}})
    return tau, rev


def _add_references(run_dir: Path, references: list[str], chosen: list[str], top: int,
                    notes: list[str]) -> dict[str, list[str]]:
    """The naive choices named by ``references`` (checkpoint -> its rules), appended to ``chosen``
    when not among the top N already; a note for each, and for a rule the run cannot resolve."""
    refs: dict[str, list[str]] = {}
    if not references:
        return refs
    for base, rules in naive_choices(run_dir).items():
        rules = [r for r in rules if r in references]
        if not rules:
            continue
        refs[base] = rules
        what = " and ".join(rules)
        if base in chosen:
            notes.append(f"reference {what}: {base} is among the top {top} already.")
        else:
            chosen.append(base)
            notes.append(f"reference {what}: {base} is retrained next to the top {top} (the naive choice the pick "
                         "must beat, at the confirmation budget under the same matched SFT).")
    for r in references:
        if not any(r in rules for rules in refs.values()):
            notes.append(f"reference {r}: the run has no value it needs (checkpoint steps in manifest.json, "
                         "held-out bits per byte in summary.csv); not retrained.")
    return refs


CLAIMS = ("winner", "beats_default")  # pilot verdicts that claim a comparison the confirmation can re-test


def confirm_spec(spec: SelectionSpec, pilot_decision: dict[str, Any], notes: list[str]) -> SelectionSpec:
    """The rule the confirmation ranks with: the plan's, except that a comparison the pilot claimed (verdict
    ``winner`` or ``beats_default``) is re-tested with ``selection.decision.confirm_margin`` when the plan sets
    one. Without such a claim (no clear winner, or a single eligible base: no comparison) the confirmation
    decides under the pilot's own margin (a weaker margin would give the pipeline a second, easier chance)."""
    pilot_recommended = pilot_decision.get("recommended")
    if (pilot_recommended is None or pilot_decision.get("verdict") not in CLAIMS or spec.confirm_margin is None
            or spec.confirm_margin == spec.tie_margin):
        return spec
    notes.append(f"the pilot's claim for {pilot_recommended} is re-tested with the plan's confirm_margin "
                 f"{spec.confirm_margin:g} (selection.decision.confirm_margin), not the pilot's tie_margin "
                 f"{spec.tie_margin:g}: at this budget the claim must not reverse; it need not clear the margin again.")
    return replace(spec, tie_margin=spec.confirm_margin)


def retest_against_default(tables: PilotTables, spec: SelectionSpec, pilot_decision: dict[str, Any],
                           default: str | None, chosen: Sequence[str], seeds: Sequence[int]) -> dict[str, Any] | None:
    """The pilot's ``beats_default`` claim re-tested at the confirmation budget (module docstring,
    ``claim_retest``): the recommended base against ``default`` alone under ``spec`` (the confirmation's
    rule: its margin and constraints), on the confirmation ranking's ``seeds``. None when the pilot made no
    such claim or either base was not confirmed."""
    rec = pilot_decision.get("recommended")
    if (pilot_decision.get("verdict") != "beats_default" or rec is None or default is None or rec == default
            or rec not in chosen or default not in chosen):
        return None

    def keep(df):
        return df[df["seed"].isin(list(seeds))] if df is not None and "seed" in df.columns else df

    pair = rank_bases(PilotTables(tables.out_dir, keep(tables.transfer), keep(tables.items), keep(tables.diagnostics)),
                      replace(spec, against=None), bases=[rec, default])
    sign = 1.0 if spec.direction == "higher" else -1.0
    v = pair.table.set_index("base")["value"].astype(float)
    diff = float(sign * (v[rec] - v[default]))
    ci = None
    if pair.diff_ci is not None:
        lo, hi = pair.diff_ci
        ci = [lo, hi] if pair.top == rec else [-hi, -lo]
    held = pair.top == rec and pair.verdict in ("winner", "single_eligible")
    return {"claim": "beats_default", "base": rec, "default": default, "diff": diff, "diff_ci": ci,
            "margin": spec.tie_margin, "verdict": pair.verdict, "reason": pair.reason, "held": bool(held),
            "default_fails_constraint": pair.verdict == "single_eligible" and pair.top == rec,
            "seeds": list(pair.seeds), "notes": list(pair.notes),
            "interval": ("one comparison fixed before the confirmation's data (no Bonferroni); "
                         + ("seed-level paired t" if spec.interval == "seeds" else "seeds + items"))}


def after_default_claim(pick: str, confirm_top: str | None, confirm_table: Sequence[dict[str, Any]],
                        tie_margin: float | None) -> str:
    """The base recommended when the pilot's ``beats_default`` claim held at the confirmation but the pick was
    not confirmed in the ordinary sense (``probeselect.final_report.confirmation_status``: "default_beaten"):
    the confirmation's top only when the confirmation separates it from the pick by the plan's tie margin (the
    interval of top - pick lies above it: the margin the pilot had to clear, not the confirm_margin); otherwise
    the pilot's pick, whose claim against the default was replicated."""
    if confirm_top and confirm_top != pick and tie_margin is not None:
        row = next((r for r in confirm_table if r.get("base") == pick), None)
        lo = row.get("diff_vs_top_lo") if row else None
        if lo is not None and lo == lo and lo > tie_margin:
            return confirm_top
    return pick


def _naive_and_reversal_words(naive: list[dict[str, Any]], rev: list[dict[str, Any]], top: str | None) -> str:
    """The statement's sentences on each confirmed naive choice (against the confirmation's top) and on every
    reversal."""
    out = ""
    for n in naive:
        what = " and ".join({"latest": "the latest checkpoint", "lowest_bpb": "the lowest held-out bpb"}[r]
                            for r in n["rules"])
        if n["is_top"]:
            out += f" The naive choice {n['base']} ({what}) is the best base at the confirmation budget."
        elif n["diff_vs_top"] is not None:
            lo, hi = n["diff_vs_top_lo"], n["diff_vs_top_hi"]
            iv = (f" (interval {lo:.3g} to {hi:.3g})" if lo is not None and hi is not None
                  else " (no interval: one SFT seed)")
            out += f" The naive choice {n['base']} ({what}): {top} is ahead of it by {n['diff_vs_top']:.3g}{iv}."
        elif n["eligible"] is False:
            out += f" The naive choice {n['base']} ({what}) fails a constraint at the confirmation budget."
    if rev:
        out += " Reversals: " + "; ".join(f"{r['pilot_ahead']} was ahead of {r['confirm_ahead']} in the pilot "
                                          f"but behind at confirmation" for r in rev) + "."
    return out


def _claim_words(claim: dict[str, Any]) -> str:
    """The statement's sentence on a re-tested beats_default claim."""
    ci = claim["diff_ci"]
    iv = f"interval {ci[0]:.3g} to {ci[1]:.3g}, " if ci else ""
    how = ("the default fails a selection constraint at this budget, the pick passes" if claim.get(
        "default_fails_constraint") else claim["verdict"].replace("_", " "))
    return (f" The pilot's claim that {claim['base']} beats the default {claim['default']} "
            f"{'held' if claim['held'] else 'did NOT hold'} at this budget: difference {claim['diff']:.3g} "
            f"({iv}margin {claim['margin']:g}; {how}).")


def seed_overlap(pilot_seeds: Sequence[int] | None, confirm_seeds: Sequence[int], notes: list[str]) -> list[int]:
    """SFT seeds the confirmation shares with the pilot (same data order and adapter initialisation), with a note
    when there are any: the confirmation then re-measures the pilot's bases at a larger budget, but its noise is
    not independent of the noise that put them on top, so it is no independent replication of the claim.
    ``confirm_seeds``: every seed the confirmation trained (its transfer table), not only those all bases share."""
    pilot = set(int(x) for x in pilot_seeds or ())
    confirm_set = set(int(x) for x in confirm_seeds)
    shared = sorted(pilot & confirm_set)
    if shared:
        start = max(pilot | confirm_set) + 1
        fresh = ", ".join(str(start + i) for i in range(len(confirm_set)))
        notes.append(f"the confirmation reuses the pilot's SFT seeds {shared} (same data order and adapter "
                     "initialisation): its noise is not independent of the noise that ranked the pilot, so it is "
                     f"not an independent replication. Give the confirmation other seeds (an override such as "
                     f"seeds=[{fresh}]) for one.")
    return shared


def confirm(run_dir: str | Path, recipe: str | Path, *, top: int = 2, overrides: Sequence[str] = (),
            out_dir: str | Path | None = None, progress: bool = True, device: str = "auto",
            jobs: int | None = None, references: Sequence[str] = ()) -> ConfirmResult:
    """Retrain the top ``top`` pilot bases under ``recipe`` and check the pilot decision.

    Needs ``run_dir/selection.json`` (``probeselect select``). Writes ``run_dir/confirm/``
    (pilot layout) and ``run_dir/confirm.json``; see the module docstring. ``jobs``: bases
    retrained at once (worker processes on the CPU or one CUDA device; see :func:`probeselect.pilot.resolve_jobs`).
    ``references``: naive choices (``latest``, ``lowest_bpb``) retrained next to the top N.
    """
    run_dir = Path(run_dir)
    sel_path = run_dir / "selection.json"
    if not sel_path.is_file():
        raise SelectionError(f"{sel_path}: no selection yet; run `probeselect select {run_dir}` first.")
    if top < 1:
        raise SelectionError(f"--top must be >= 1, got {top}.")
    references = list(references or [])
    if not valid_references(references):
        raise SelectionError(f"confirmation references must be distinct naive choices from {list(REFERENCES)}; "
                             f"got {references!r}.")
    sel = json.loads(sel_path.read_text(encoding="utf-8"))
    spec = selection_spec_from_dict(sel["selection_plan"], source=str(sel_path))
    ranked = [b["base"] for b in sel["bases"]]
    notes: list[str] = []
    if len(ranked) < top:
        notes.append(f"only {len(ranked)} piloted bases; confirming all of them (asked for {top}).")
    chosen = ranked[:top]
    if spec.against and spec.against not in references:
        # a plan that decides against the default needs the default at the confirmation budget too
        references.append(spec.against)
        notes.append(f"the plan decides against the {spec.against} checkpoint (selection.decision.against), so it is "
                     "retrained as a reference.")
    refs = _add_references(run_dir, references, chosen, top, notes)
    if len(chosen) < 2:
        notes.append("one base confirmed: there is no ranking to compare, only whether it still passes the constraints.")
    out = Path(out_dir) if out_dir is not None else run_dir / "confirm"
    run_pilot = _load_pilot_fn()
    run_pilot(base_paths(run_dir, chosen), recipe, out, progress=progress, device=device, overrides=list(overrides),
              **({"jobs": jobs} if jobs is not None else {}))

    tables = load_pilot_tables(out)
    dec = sel["decision"]
    pilot_rec = dec.get("recommended")
    spec_c = confirm_spec(spec, dec, notes)
    retest = spec_c is not spec  # the pilot's claim is re-tested with the plan's confirm_margin
    default = next((b for b, rules in refs.items() if spec.against in rules), None)
    ranking = rank_bases(tables, spec_c, bases=chosen, default=default)
    claim = retest_against_default(tables, spec_c, dec, default, chosen, ranking.seeds)
    shared = seed_overlap(dec.get("seeds"), tables.transfer["seed"].unique().tolist(), notes)
    pilot_vals = {b["base"]: b["value"] for b in sel["bases"] if b["base"] in chosen and b.get("value") is not None}
    conf_vals = ranking.table.set_index("base")["value"].to_dict()
    tau, rev = compare_rankings(pilot_vals, conf_vals, spec.direction)
    if pilot_rec is None:
        held = None
        statement = (f"The pilot named no winner ({dec.get('verdict', '?').replace('_', ' ')}); at the confirmation "
                     f"budget the best eligible base is {ranking.top or 'none'} "
                     f"({ranking.verdict.replace('_', ' ')}).")
    elif pilot_rec not in chosen:
        held = None
        statement = f"The pilot's recommendation {pilot_rec} was not among the confirmed bases."
    else:
        held = ranking.top == pilot_rec
        statement = (f"The pilot decision {'held' if held else 'did NOT hold'}: {pilot_rec} is "
                     f"{'still' if held else 'no longer'} the best eligible base at the confirmation budget"
                     + ("" if held else f" ({ranking.top or 'no base'} is)") +
                     f"; confirmation verdict: {ranking.verdict.replace('_', ' ')}"
                     + (f" (the claim re-tested with margin {spec_c.tie_margin:g}, selection.decision.confirm_margin)"
                        if retest else "") + "." + (_claim_words(claim) if claim else ""))
        if claim and claim["held"] and not (held and ranking.verdict in CLAIMS + ("single_eligible",)):
            statement += (f" The plan's question (the default or not) got the same answer at both budgets: "
                          f"{after_default_claim(pilot_rec, ranking.top, records(ranking.table), spec.tie_margin)} "
                          "is recommended, not the default.")
    naive = _naive_rows(records(ranking.table), refs, ranking.top)
    statement += _naive_and_reversal_words(naive, rev, ranking.top)
    recipe_sha = sha256_file(Path(recipe)) if Path(recipe).is_file() else None
    rec = base_manifest("confirm", {"run_dir": str(run_dir), "recipe": str(recipe), "overrides": list(overrides),
                                    "top": top, "out_dir": str(out),
                                    **({"references": references} if references else {})})
    rec.update(
        recipe_sha256=recipe_sha,
        recipe_key=canonical_json_hash({"recipe": recipe_sha, "overrides": list(overrides)}),
        selection_sha256=sha256_file(sel_path),
        post_hoc=bool(sel.get("post_hoc")),
        bases=chosen,
        references={r: b for b, rules in refs.items() for r in rules},
        naive=naive,
        pilot_values=pilot_vals,
        confirm_values=conf_vals,
        primary={"metric": spec.primary, "direction": spec.direction},
        kendall_tau=tau,
        reversals=rev,
        pilot_decision={"verdict": dec.get("verdict"), "recommended": pilot_rec},
        confirm_decision=ranking.summary(spec_c),
        confirm_table=records(ranking.table),
        held=held,
        **({"claim_retest": claim} if claim else {}),
        **({"retest_margin": spec_c.tie_margin} if retest else {}),
        **({"seeds_shared_with_pilot": shared} if shared else {}),
        statement=statement,
        notes=notes + ranking.notes,
        inputs={f"confirm/{k}": v for k, v in tables.hashes().items()},
    )
    json_path = run_dir / "confirm.json"
    atomic_write_json(json_path, rec)
    return ConfirmResult(ranking=ranking, kendall_tau=tau, reversals=rev, held=held, statement=statement, record=rec,
                         json_path=json_path)
