"""Subcommands of the final comparison: ``plan lock``, ``select``, ``confirm``, ``replicate`` and ``run``.

Registered in :mod:`probeselect.cli` by ``add_parsers(sub)``; each command is a thin
wrapper over a public function (:func:`probeselect.plan.lock_plan`,
:func:`probeselect.select.select`, :func:`probeselect.confirm.confirm`, :func:`probeselect.replicate.replicate`,
:func:`probeselect.run.run_pipeline`).
"""

from __future__ import annotations

import argparse
import sys

from ._cli_common import DEVICE_HELP, check_device

#: probeselect.plan.REFERENCES, spelled out so that ``--help`` does not import pandas (a test keeps them equal).
CONFIRM_REFERENCES = ("latest", "lowest_bpb")


def _fmt(x) -> str:
    return "n/a" if x is None or x != x else f"{x:.4g}"


def _cmd_plan(args: argparse.Namespace) -> int:
    from .plan import LOCK_NAME, lock_plan

    rec = lock_plan(args.plan, args.run, force=args.force, allow_weak=args.allow_weak, recipe=args.recipe)
    print(f"locked {args.plan} (sha256 {rec['plan_sha256'][:12]}) at {rec['locked_utc']}: "
          f"{len(rec['files'])} result file(s) recorded in {args.run}/{LOCK_NAME}")
    null = rec.get("proxy_null") or {}
    if null.get("beatable") and null.get("message"):  # an unbeatable null is printed as a warning below
        print(null["message"])
    for label, members in (rec.get("strata") or {}).items():
        print(f"stratum {label}: {', '.join(members)}")
    for rule, base in (rec.get("window_ends") or {}).items():
        print(f"reference {rule}: {base or '(no candidate in this window)'}")
    for w in rec.get("warnings", []):
        print(f"warning: {w}", file=sys.stderr)
    if rec.get("shortlist_files_at_lock"):
        print(f"warning: {rec['shortlist_files_at_lock'][0]} already exists: lock before the shortlist; a selection "
              "from this run will be POST-HOC.", file=sys.stderr)
    if rec["outcome_files_at_lock"]:
        print(f"warning: {len(rec['outcome_files_at_lock'])} pilot/transfer result file(s) already exist "
              f"(e.g. {rec['outcome_files_at_lock'][0]}): a selection from this run will be POST-HOC.", file=sys.stderr)
    return 0


def _cmd_select(args: argparse.Namespace) -> int:
    from .select import select

    res = select(args.run_dir, plan_path=args.plan, pilot_dir=args.pilot, allow_post_hoc=args.allow_post_hoc)
    r = res.ranking
    if res.post_hoc:
        print("POST-HOC selection: " + "; ".join(res.post_hoc_reasons), file=sys.stderr)
    cols = [c for c in ("base", "position", "eligible", "value", "ci_lo", "ci_hi", "p_best", "failed_constraints")
            if c in r.table.columns]
    with __import__("pandas").option_context("display.width", 200, "display.max_colwidth", 60):
        print(r.table[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if r.verdict == "winner":
        print(f"recommended: {r.recommended} ({r.top} - {r.runner_up} = {_fmt(r.diff)}, interval "
              f"{_fmt(r.diff_ci[0])} to {_fmt(r.diff_ci[1])}, P(top beats runner-up) {_fmt(r.p_top_beats_runner_up)})")
    elif r.verdict == "beats_default":
        lo, hi = r.default_ci or (None, None)
        print(f"recommended: {r.recommended}, better than the default {r.default} ({r.top} - {r.default} = "
              f"{_fmt(r.default_diff)}, interval {_fmt(lo)} to {_fmt(hi)}); {r.reason}")
    elif r.verdict == "no_clear_winner":
        ci = r.diff_ci or (None, None)
        print(f"no clear winner ({r.reason}): {r.top} vs {r.runner_up} difference {_fmt(r.diff)}, interval "
              f"{_fmt(ci[0])} to {_fmt(ci[1])}; P(top beats runner-up) {_fmt(r.p_top_beats_runner_up)}")
    else:
        print(f"{r.verdict.replace('_', ' ')}: recommended {r.recommended or 'none'}")
    if len(res.proxies):
        print(res.proxies[["proxy", "n_bases", "spearman", "kendall", "p_single_spearman", "p_best_of_m_spearman"]]
              .to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    for n in res.notes:
        print(f"note: {n}", file=sys.stderr)
    print(f"selection: {res.json_path} and {res.csv_path}" + (" [POST-HOC]" if res.post_hoc else ""))
    return 0


def _cmd_confirm(args: argparse.Namespace) -> int:
    from .confirm import confirm

    check_device(args.device)
    res = confirm(args.run_dir, args.recipe, top=args.top, overrides=args.overrides,
                  progress=not args.no_progress, device=args.device, jobs=args.jobs, references=args.references)
    print(res.statement)
    print(f"Kendall tau (pilot vs confirmation): {_fmt(res.kendall_tau)}; reversals: {len(res.reversals)}")
    print(f"confirmation: {res.json_path}")
    return 0


def _cmd_replicate(args: argparse.Namespace) -> int:
    from .replicate import replicate

    check_device(args.device)
    res = replicate(args.run_dir, seeds=args.seeds, progress=not args.no_progress, device=args.device, jobs=args.jobs)
    print(res.statement)
    print(f"replication: {res.json_path}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .run import run_pipeline

    overrides = list(args.overrides) + ([f"device={args.device}"] if args.device is not None else [])
    if args.device is not None:
        check_device(args.device)
    res = run_pipeline(args.config, overrides=overrides, force=args.force, progress=not args.no_progress)
    for st in res.stages:
        print(f"{st.name:<10} {st.status:<8} {st.seconds:7.1f}s  {st.detail}")
    print(f"run: {res.out_dir} (report: {res.report})")
    return 0


def add_parsers(sub) -> None:
    """Add ``plan``, ``select``, ``confirm`` and ``run`` to the top-level subparsers."""
    pl = sub.add_parser("plan", help="lock a selection plan into a run before pilot results exist",
                        description="Predeclaration: record the plan's hash and text and the run's files.")
    pls = pl.add_subparsers(dest="plan_command", required=True, metavar="ACTION")
    lk = pls.add_parser("lock", help="write RUN_DIR/plan.lock.json",
                        description="Write RUN_DIR/plan.lock.json: the plan's sha256, a copy of its text, the time "
                                    "and every result file in RUN_DIR with its sha256. Lock after scoring and BEFORE the "
                                    "shortlist; every name in the plan is checked against the run (and --recipe). "
                                    "`probeselect select` refuses to run without a lock.")
    lk.add_argument("plan", metavar="PLAN", help="selection plan YAML, e.g. recipes/selection.yaml")
    lk.add_argument("--run", required=True, metavar="RUN_DIR", help="the scored run folder (with summary.csv)")
    lk.add_argument("--force", action="store_true", help="replace an existing lock (the old record is kept)")
    lk.add_argument("--recipe", default=None, metavar="RECIPE",
                    help="pilot recipe: check the plan's transfer metrics against its transfer suite and its seeds "
                         "against selection.min_sft_seeds")
    lk.add_argument("--allow-weak", action="store_true",
                    help="lock although no proxy can beat the best-of-M null at 95%% with this shortlist size k")
    pl.set_defaults(func=_cmd_plan)

    s = sub.add_parser("select", help="select a base by held-out transfer under the locked plan",
                       description="Rank the piloted bases by the plan's primary transfer metric (seed mean) subject "
                                   "to its constraints, with seed-level paired t intervals, validate the "
                                   "proxies against a selection-effect null, and write selection.json/selection.csv.")
    s.add_argument("run_dir", metavar="RUN_DIR", help="scored run folder with plan.lock.json, shortlist.csv and pilot/")
    s.add_argument("--plan", default=None, help="plan file (default: the path recorded in the lock)")
    s.add_argument("--pilot", default=None, help="pilot output folder (default RUN_DIR/pilot)")
    s.add_argument("--allow-post-hoc", action="store_true",
                   help="proceed although the plan changed after the lock or results predate it; outputs say POST-HOC")
    s.set_defaults(func=_cmd_select)

    c = sub.add_parser("confirm", help="retrain the top N pilot bases at the larger budget and check the decision",
                       description="Run the pilot runner on the top N bases of RUN_DIR/selection.json with the "
                                   "confirmation recipe into RUN_DIR/confirm, rank them with the same plan and write "
                                   "confirm.json (Kendall tau, every reversal, whether the decision held).")
    c.add_argument("run_dir", metavar="RUN_DIR",
                   help="the scored run folder holding selection.json (from `probeselect select`) and pilot/")
    c.add_argument("--recipe", required=True, help="confirmation recipe, e.g. recipes/confirm.yaml")
    c.add_argument("--top", type=int, default=2, help="how many pilot bases to confirm (default 2)")
    c.add_argument("--references", nargs="+", default=[], choices=CONFIRM_REFERENCES, metavar="RULE",
                   help="also retrain these naive choices next to the top N: latest (the ladder's latest "
                        "checkpoint), lowest_bpb (lowest pretraining held-out bits per byte); the confirmation then "
                        "compares the pick with them at the intended budget (a plan with selection.decision.against "
                        "adds its rule itself)")
    c.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides (dotted keys)")
    c.add_argument("--device", default="auto", help=DEVICE_HELP)
    c.add_argument("--jobs", default=None, metavar="N",
                   help="retrain N bases at once in worker processes, on the CPU or sharing one CUDA device "
                        "(same numbers); default PROBESELECT_JOBS, else 1")
    c.add_argument("--no-progress", action="store_true", help="hide progress bars")
    c.set_defaults(func=_cmd_confirm)

    rp = sub.add_parser("replicate", help="re-test on fresh SFT seeds a claim only the confirmation made",
                        description="When the pilot named no winner (or its pick was not confirmed) and the "
                                    "confirmation names a clear winner or a base better than the plan's default, "
                                    "retrain that comparison with the confirmation's recipe and budget on SFT seeds "
                                    "neither stage used, and write replicate.json (held or not). Trains nothing "
                                    "when there is no such claim.")
    rp.add_argument("run_dir", metavar="RUN_DIR", help="the run folder holding selection.json and confirm.json")
    rp.add_argument("--seeds", type=int, nargs="+", default=None, metavar="SEED",
                    help="fresh SFT seeds (default: the next ones after the pilot's and the confirmation's, as many "
                         "as the confirmation had)")
    rp.add_argument("--device", default="auto", help=DEVICE_HELP)
    rp.add_argument("--jobs", default=None, metavar="N", help="retrain N bases at once in worker processes")
    rp.add_argument("--no-progress", action="store_true", help="hide progress bars")
    rp.set_defaults(func=_cmd_replicate)

    r = sub.add_parser("run", help="run the whole pipeline from one YAML config (resumable)",
                       description="ladder -> score -> average (optional: `average: {window: K}`) -> dynamics -> "
                                   "plan lock -> shortlist -> pilot (+ transfer) -> select -> confirm -> replicate (optional: "
                                   "`replicate: {}`) -> report. "
                                   "A stage whose outputs are complete and whose inputs "
                                   "are unchanged (OUT/run_state.json) is skipped. Example: recipes/demo.yaml.")
    r.add_argument("config", metavar="CONFIG", help="pipeline config YAML, e.g. recipes/demo.yaml")
    r.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (dotted keys, YAML values)")
    r.add_argument("--force", nargs="*", default=None, metavar="STAGE",
                   help="rerun these stages (no names: every stage) even if up to date")
    r.add_argument("--device", default=None,
                   help=DEVICE_HELP.replace("(default auto)", "(default: the config's `device`, else auto)"))
    r.add_argument("--no-progress", action="store_true", help="hide progress bars")
    r.set_defaults(func=_cmd_run)
