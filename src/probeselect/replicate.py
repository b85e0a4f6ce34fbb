"""Replicate, on fresh SFT seeds, a claim that only the confirmation made.

The confirmation re-tests the pilot's claim. When the pilot made none (no clear winner), or its pick did not
hold, and the confirmation names a base a clear winner (``winner``) or better than the plan's default
(``beats_default``), that claim rests on one set of SFT seeds and was not predicted by the pilot: it is a
discovery, which the report calls "a result of the confirmation alone, not replicated". ``replicate(run_dir)``
tests it once more, as the confirmation tests the pilot's claim:

* the same recipe, overrides and budget as the confirmation (read from ``confirm.json``; the recipe must be
  unchanged), with SFT seeds that neither the pilot nor the confirmation used (by default the next ones after
  both, as many as the confirmation had), so the noise that produced the claim is not the noise that tests it;
* ``winner``: every confirmed base is retrained and ranked under the plan's rule; the claim held when the same
  base is named a clear winner (Bonferroni over the same comparisons as the confirmation);
* ``beats_default``: the base and the default alone are retrained; one comparison, fixed before the data
  (:func:`probeselect.confirm.retest_against_default`);
* the margin is the plan's ``selection.decision.confirm_margin`` when it sets one (a claim re-tested must not
  reverse; it need not clear the tie margin a third time), else its tie margin: the rule the confirmation
  applies to the pilot's claim.

Writes ``run_dir/replicate/seeds-S1-...-Sn/`` (pilot layout, one folder per attempt) and ``run_dir/replicate.json`` (``needed``; ``claim``: base, verdict,
default; ``seeds``; ``held``; the ranking; ``confirm_sha256``, the ``confirm.json`` it replicates;
``earlier_attempts``: attempts on other seeds for the same ``confirm.json``, kept: a claim that failed once and held
on a retry is not counted as replicated). When there is
nothing to replicate it trains nothing and writes ``needed: false`` with the reason. The report reads it with
:func:`probeselect.final_report.attach_replication`: a held replication makes the claimed base the recommendation
(``probeselect.final_report.confirmation_status``: "replicated"); one that did not hold is said so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from ._io import atomic_write_json, sha256_file
from .errors import SelectionError
from .manifest import base_manifest
from .plan import selection_spec_from_dict
from .select import load_pilot_tables, rank_bases, records

__all__ = ["ReplicateResult", "replicate", "replication_claim", "fresh_seeds", "used_seeds"]



@dataclass
class ReplicateResult:
    needed: bool
    held: bool | None
    statement: str
    record: dict[str, Any]
    json_path: Path


def replication_claim(sel: dict[str, Any], conf: dict[str, Any] | None) -> dict[str, Any] | None:
    """The confirmation's own claim when the pipeline has no recommendation without it, else None: the pilot named
    no winner, or its pick was not confirmed (nor its claim against the default re-established), and the
    confirmation's verdict is ``winner`` or ``beats_default``. Returns ``{"base", "verdict", "default"}``."""
    from .final_report import replication_needed

    if not replication_needed(sel, conf):
        return None
    cd = conf.get("confirm_decision") or {}
    base = cd.get("recommended") or cd.get("top")
    if not base:
        return None
    default = cd.get("default") if cd.get("verdict") == "beats_default" else None
    if cd.get("verdict") == "beats_default" and not default:
        return None
    return {"base": base, "verdict": cd["verdict"], "default": default}


def used_seeds(run_dir: Path, sel: dict[str, Any], conf: dict[str, Any]) -> set[int]:
    """Every SFT seed the pilot and the confirmation trained: their decisions' seeds and their transfer tables'
    (``RUN/pilot``, ``RUN/confirm`` and the confirmation's own ``out_dir`` when it wrote elsewhere)."""
    used = set(int(s) for s in (sel.get("decision") or {}).get("seeds") or [])
    used |= set(int(s) for s in (conf.get("confirm_decision") or {}).get("seeds") or [])
    folders = [run_dir / "pilot", run_dir / "confirm"]
    if (conf.get("config") or {}).get("out_dir"):
        folders.append(Path(conf["config"]["out_dir"]))
    for folder in folders:
        t = folder / "transfer.csv"
        if t.is_file():
            import pandas as pd

            used |= set(int(s) for s in pd.read_csv(t, usecols=["seed"])["seed"].unique())
    return used


def fresh_seeds(used: set[int], n: int) -> list[int]:
    """``n`` SFT seeds after every seed in ``used``."""
    start = max(used, default=-1) + 1
    return list(range(start, start + int(n)))


def _words(claim: dict[str, Any], held: bool, seeds: Sequence[int], detail: str) -> str:
    what = (f"{claim['base']} is a clear winner" if claim["verdict"] == "winner"
            else f"{claim['base']} beats the default {claim['default']}")
    return (f"The confirmation's own claim ({what}) {'held' if held else 'did NOT hold'} on fresh SFT seeds "
            f"{list(seeds)} at the confirmation budget: {detail}.")


def _no_claim_reason(sel: dict[str, Any], conf: dict[str, Any]) -> str:
    """Why no replication is needed, in the words of the confirmation status (final_report.confirmation_status)."""
    from .final_report import confirmation_status

    cs = confirmation_status(sel, {k: v for k, v in conf.items() if k != "replication"})
    cd = conf.get("confirm_decision") or {}
    why = {"confirmed": f"the confirmation confirmed the pilot's pick {cs.pilot_pick}",
           "default_beaten": (f"the pilot's claim that {cs.pilot_pick} beats the default held at the confirmation (the "
                              "recommendation rests on that claim, made by the pilot and re-tested; which of the bases "
                              "that beat the default is named is not re-tested here)"),
           "not_included": f"the pilot's pick {cs.pilot_pick} was not among the confirmed bases"}.get(
        cs.status, f"the confirmation makes no comparative claim (verdict {str(cd.get('verdict')).replace('_', ' ')})")
    return why + ": nothing trained"


def _replication_spec(spec, conf: dict[str, Any], claim: dict[str, Any], notes: list[str]):
    """The rule the claim is re-tested with. After a confirmation that ranked with the plan's tie margin, the claim
    cleared it once, so (as the confirmation does for the pilot's claim) the plan's confirm_margin applies when set:
    it must not reverse. After a confirmation that ranked with confirm_margin (it re-tested a pilot claim), the
    confirmation's own claim cleared only that: the replication asks for the tie margin."""
    from .confirm import confirm_spec

    if conf.get("retest_margin") is not None:
        notes.append(f"the confirmation ranked with the plan's confirm_margin {conf['retest_margin']:g} (it re-tested "
                     f"the pilot's claim), so its own claim has not cleared the tie margin yet: re-tested with the "
                     f"tie margin {spec.tie_margin:g}.")
        return spec
    spec_r = confirm_spec(spec, {"verdict": claim["verdict"], "recommended": claim["base"]}, [])
    if spec_r is not spec:
        notes.append(f"re-tested with the plan's confirm_margin {spec_r.tie_margin:g}: the claim cleared the tie "
                     f"margin {spec.tie_margin:g} at the confirmation and must not reverse here.")
    return spec_r


def _test_claim(tables, spec_r, claim: dict[str, Any], bases: list[str], conf: dict[str, Any]):
    """(ranking, the one-comparison re-test or None, held, detail words) of the claim on the replication's tables."""
    from .confirm import retest_against_default

    if claim["verdict"] == "beats_default":
        spec_r = replace(spec_r, against=None)
        ranking = rank_bases(tables, spec_r, bases=bases)
        test = retest_against_default(tables, spec_r, {"verdict": "beats_default", "recommended": claim["base"]},
                                      claim["default"], bases, ranking.seeds)
        ci = (test or {}).get("diff_ci")
        detail = (f"{claim['base']} - {claim['default']} = {(test or {}).get('diff', float('nan')):.4g}"
                  + (f" (interval {ci[0]:.4g} to {ci[1]:.4g})" if ci else " (no interval)")
                  + f", margin {spec_r.tie_margin:g}, one comparison")
        return ranking, test, bool(test and test["held"]), detail
    default = (conf.get("confirm_decision") or {}).get("default")
    ranking = rank_bases(tables, spec_r, bases=bases, default=default if default in bases else None)
    held = ranking.top == claim["base"] and ranking.verdict in ("winner", "single_eligible")
    ci = ranking.diff_ci
    vs = (f"; {ranking.top} - {ranking.runner_up} = {ranking.diff:.4g}"
          + (f" (interval {ci[0]:.4g} to {ci[1]:.4g}, Bonferroni over {ranking.n_comparisons} comparison{'s' if ranking.n_comparisons != 1 else ''})" if ci else "")
          if ranking.runner_up and ranking.diff is not None else "")
    detail = (f"{ranking.top or 'no base'} is best there ({ranking.verdict.replace('_', ' ')}, "
              f"margin {spec_r.tie_margin:g}{vs}{'; ' + ranking.reason if ranking.reason else ''})")
    return ranking, None, held, detail


def _earlier_attempts(json_path: Path, rec: dict[str, Any], seeds: list[int]) -> list[dict[str, Any]]:
    """Attempts of an existing replicate.json for the same confirm.json on other seeds (kept, never overwritten)."""
    if not json_path.is_file():
        return []
    try:
        old = json.loads(json_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return []
    if not old.get("needed") or old.get("confirm_sha256") != rec["confirm_sha256"]:
        return []
    earlier = list(old.get("earlier_attempts") or [])
    if old.get("seeds") != seeds:
        earlier.append({"seeds": old.get("seeds"), "held": old.get("held"), "statement": old.get("statement")})
    return earlier


def _load_record(path: Path, cmd: str) -> dict[str, Any]:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SelectionError(f"{path}: not valid JSON ({e}); re-run `{cmd} {path.parent}` to write it again.") from e
    if not isinstance(rec, dict):
        raise SelectionError(f"{path}: expected a JSON object; re-run `{cmd} {path.parent}`.")
    return rec


def replicate(run_dir: str | Path, *, seeds: Sequence[int] | None = None, progress: bool = True,
              device: str = "auto", jobs: int | None = None) -> ReplicateResult:
    """Replicate the confirmation's own claim (module docstring). ``seeds``: the fresh SFT seeds (default: as many as
    the confirmation's, after every seed of :func:`used_seeds`); they must not overlap the pilot's or the
    confirmation's, and there must be at least the plan's ``min_sft_seeds`` (fewer could not decide). An earlier
    attempt on other seeds for the same ``confirm.json`` is kept in ``earlier_attempts``."""
    from .confirm import _load_pilot_fn, base_paths

    run_dir = Path(run_dir)
    sel_path, conf_path = run_dir / "selection.json", run_dir / "confirm.json"
    for p, cmd in ((sel_path, "probeselect select"), (conf_path, "probeselect confirm")):
        if not p.is_file():
            raise SelectionError(f"{p}: not found; run `{cmd} {run_dir}` first (replicate re-tests the "
                                 "confirmation's claim).")
    sel, conf = _load_record(sel_path, "probeselect select"), _load_record(conf_path, "probeselect confirm")
    if conf.get("selection_sha256") != sha256_file(sel_path):
        raise SelectionError(f"{conf_path}: made from another selection.json; re-run `probeselect confirm` first.")
    rec = base_manifest("replicate", {"run_dir": str(run_dir), "seeds": list(seeds) if seeds is not None else None})
    rec.update(confirm_sha256=sha256_file(conf_path), selection_sha256=sha256_file(sel_path))
    json_path = run_dir / "replicate.json"
    claim = replication_claim(sel, conf)
    if claim is None:
        why = _no_claim_reason(sel, conf)
        rec.update(needed=False, held=None, reason=why, statement=f"Nothing to replicate: {why}.")
        atomic_write_json(json_path, rec)
        return ReplicateResult(False, None, rec["statement"], rec, json_path)

    spec = selection_spec_from_dict(sel["selection_plan"], source=str(sel_path))
    used = used_seeds(run_dir, sel, conf)
    n_conf = max(len((conf.get("confirm_decision") or {}).get("seeds") or []), int(spec.min_sft_seeds), 2)
    seeds = [int(s) for s in (seeds if seeds is not None else fresh_seeds(used, n_conf))]
    if not seeds or len(set(seeds)) != len(seeds) or set(seeds) & used or min(seeds) < 0:
        raise SelectionError(f"replicate seeds {seeds} must be distinct, non-negative and fresh: the pilot and the "
                             f"confirmation used {sorted(used)}. Pass others, e.g. {fresh_seeds(used, n_conf)}.")
    if len(seeds) < max(int(spec.min_sft_seeds), 2):
        raise SelectionError(f"replicate seeds {seeds}: {len(seeds)} seed(s), but the plan's selection.min_sft_seeds "
                             f"is {spec.min_sft_seeds} (and an interval needs 2): fewer could not decide, and a "
                             f"replication that cannot decide would read as one that failed. Pass at least "
                             f"{max(int(spec.min_sft_seeds), 2)}, e.g. {fresh_seeds(used, n_conf)}.")
    recipe = Path(conf["config"]["recipe"])
    if not recipe.is_file():
        raise SelectionError(f"{recipe}: the confirmation recipe named in {conf_path} is missing (a relative path "
                             "resolves from the current folder: run from where the confirmation ran).")
    if sha256_file(recipe) != conf.get("recipe_sha256"):
        raise SelectionError(f"{recipe}: changed since {conf_path} was written (sha256 differs); a replication must "
                             "train exactly as the confirmation did. Restore the recipe or re-run `probeselect confirm`.")
    overrides = list(conf["config"].get("overrides") or []) + [f"seeds=[{', '.join(str(s) for s in seeds)}]"]
    bases = ([claim["base"], claim["default"]] if claim["verdict"] == "beats_default"
             else list(conf.get("bases") or []))
    out = run_dir / "replicate" / ("seeds-" + "-".join(str(s) for s in seeds))  # one folder per attempt
    _load_pilot_fn()(base_paths(run_dir, bases), recipe, out, progress=progress, device=device, overrides=overrides,
                     **({"jobs": jobs} if jobs is not None else {}))

    tables = load_pilot_tables(out)
    notes: list[str] = []
    spec_r = _replication_spec(spec, conf, claim, notes)
    ranking, test, held, detail = _test_claim(tables, spec_r, claim, bases, conf)
    statement = _words(claim, held, seeds, detail)
    rec.update(needed=True, claim=claim, seeds=seeds, out_dir=str(out), recipe=str(recipe), recipe_sha256=conf.get("recipe_sha256"),
               overrides=overrides, bases=bases, held=held, margin=spec_r.tie_margin,
               decision=ranking.summary(spec_r), table=records(ranking.table),
               **({"retest": test} if test else {}), statement=statement, notes=notes + ranking.notes,
               earlier_attempts=_earlier_attempts(json_path, rec, seeds),
               inputs={f"replicate/{k}": v for k, v in tables.hashes().items()})
    atomic_write_json(json_path, rec)
    return ReplicateResult(True, held, statement, rec, json_path)
