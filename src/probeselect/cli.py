"""The ``probeselect`` command line: one subcommand per stage, each a thin wrapper over
a public function that can also be called from Python."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

from . import __version__
from ._cli_common import DEVICE_HELP, add_scoring_options
from .errors import ProbeselectError, RunInterrupted


def _cmd_toy_ladder(args: argparse.Namespace) -> int:
    from .toy.ladder import build_toy_ladder

    t0 = time.perf_counter()
    info = build_toy_ladder(
        args.out_dir, seed=args.seed, steps=args.steps, save_every=args.save_every, progress=not args.no_progress,
        curriculum=args.curriculum, num_threads=args.threads, arch=args.arch, tokenizer_corpus=args.tokenizer_corpus,
    )
    acc = getattr(info, "final_accuracy", None)
    print(f"toy ladder written to {args.out_dir} in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    if acc is not None:
        print(f"final checkpoint held-out arithmetic accuracy: {acc:.1%}", file=sys.stderr)
    return 0


def _cmd_score(args: argparse.Namespace) -> int:
    from .score import score_checkpoints

    t0 = time.perf_counter()
    ladder = args.ckpt_dir
    if args.revisions or args.revision_pattern:  # CKPT_DIR is a Hub repo id
        from ._hub import resolve_hub_ladder

        ladder = resolve_hub_ladder(args.ckpt_dir, args.revisions, args.revision_pattern, fingerprint=args.fingerprint,
                                    allow_tokenizer_mismatch=args.allow_tokenizer_mismatch)
        out = Path(args.out) if args.out else Path("results") / args.ckpt_dir.rstrip("/").split("/")[-1]
    else:
        out = Path(args.out) if args.out else Path("results") / Path(args.ckpt_dir).resolve().name
    res = score_checkpoints(
        ladder,
        args.probes,
        seeds=args.seeds,
        out=out,
        dtype=args.dtype,
        device=args.device,
        max_batch_tokens=args.max_batch_tokens,
        max_length=args.max_length,
        prefix_reuse=not args.no_prefix_reuse,
        max_prefix_cache_tokens=args.max_prefix_cache_tokens,
        tokenizer=args.tokenizer,
        allow_tokenizer_mismatch=args.allow_tokenizer_mismatch,
        keep_going=args.keep_going,
        chunk_items=args.chunk_items,
        heldout=args.heldout,
        heldout_stride=args.heldout_stride,
        audit_items=args.audit_items,
        on_overflow=args.on_overflow,
        progress=not args.no_progress,
        fingerprint=args.fingerprint,
        shard=args.shard,
        merge=args.merge,
        calibrate=args.calibrate,
    )
    if int(os.environ.get("RANK", "0")) != 0:
        return 0  # rank 0 reports
    if res.manifest.get("kind") == "score-shard":
        i, n = res.manifest["shard"]
        pending = res.manifest.get("units_pending")
        print(f"shard {i}/{n}: {res.manifest['n_units_owned']} work unit(s) done, {len(res.scored)} checkpoint(s) "
              f"scored now in {time.perf_counter() - t0:.1f}s; {pending} unit(s) of the plan still pending "
              f"(record: {out}/shards/shard-{i}-of-{n}.json).", file=sys.stderr)
        if pending == 0:
            print("every unit is scored but another shard claimed the merge; run the same command with --merge "
                  "(instead of --shard) if no tables appear.", file=sys.stderr)
        for name, err in res.failed.items():
            print(f"FAILED {name}: {err}", file=sys.stderr)
        return 0
    for name, err in res.failed.items():
        print(f"FAILED {name}: {err}", file=sys.stderr)
    if res.failed:
        print(f"{len(res.failed)} checkpoint(s) failed and were skipped (--keep-going); the manifest "
              "marks this run incomplete.", file=sys.stderr)
    for path in res.superseded:
        print(f"note: the scores changed; moved the previous run's {Path(path).name} to {Path(path).parent}/",
              file=sys.stderr)
    print(score_summary_line(res, time.perf_counter() - t0), file=sys.stderr)
    from ._report_blocks import context_note

    note = context_note(res.manifest)
    if note:
        print(note, file=sys.stderr)
    cols = [c for c in ("checkpoint", "step", "family", "variant", "kind", "mean_margin", "seed_sd", "accuracy",
                        "candidate_accuracy", "bits_per_byte", "gen_consistency") if c in res.summary.columns]
    with __import__("pandas").option_context("display.width", 160, "display.max_rows", 200):
        print(res.summary[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"results: {out}/ (summary.csv, scores.parquet, items.jsonl, manifest.json); "
          f"peak RSS {res.manifest.get('peak_rss_mib')} MiB")
    return 0


def score_summary_line(res, seconds: float) -> str:
    """"scored 2 of 3 checkpoints, 1 failed, 0 from cache (5 of 9 work units reused) in 3.2s"."""
    n = res.n_checkpoints or len(res.manifest["checkpoints"])
    n_failed = len(res.failed)
    from_cache = n - len(res.scored) - n_failed
    if not res.scored and not res.failed:
        return f"all {n} checkpoints were already scored (cache hit); no model work done."
    units = (f" ({res.units_cached} of {res.units_total} work units reused from cache)"
             if res.units_cached and res.scored else "")
    return (f"scored {len(res.scored)} of {n} checkpoints, {n_failed} failed, {from_cache} from cache{units} "
            f"in {seconds:.1f}s.")


def _cmd_probes(args: argparse.Namespace) -> int:
    from .probes._cli import list_probes, show_items, validate_probe_files

    if args.probes_command == "list":
        spec_dir = Path(args.dir) if args.dir else (Path("probes") if Path("probes").is_dir() else None)
        print(list_probes(spec_dir))
        return 0
    if args.probes_command == "validate":
        results = validate_probe_files([Path(f) for f in args.files])
        bad = 0
        for path, err in results:
            print(f"{'FAIL' if err else 'ok  '} {path}" + (f": {err}" if err else ""))
            bad += err is not None
        print(f"{len(results) - bad} valid, {bad} invalid", file=sys.stderr)
        return 1 if bad else 0
    print(show_items(args.family, seed=args.seed, n=args.n, variant=args.variant))
    return 0


def _cmd_dynamics(args: argparse.Namespace) -> int:
    from .dynamics import compute_dynamics

    if not args.hop_k > 0:
        raise ProbeselectError(f"--hop-k must be a positive number, got {args.hop_k}.")
    if not args.min_hop >= 0:
        raise ProbeselectError(f"--min-hop must be a number >= 0 (nats), got {args.min_hop}.")
    res = compute_dynamics(args.run_dir, noise_window=args.noise_window, hop_k=args.hop_k, min_hop_nats=args.min_hop,
                           plots=not args.no_plots)
    cols = ["track", "n_checkpoints", "hops", "hop_threshold", "learning_crossings", "excess_variation", "flip_rate",
            "snr_last_diff"]
    cols = [c for c in cols if c in res.stats.columns]
    print(res.stats[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for note in res.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"dynamics: {res.out_dir}/ (dynamics.csv, trajectories.csv, pairs.csv, correlation.csv, plots)")
    from .attribution import write_attribution

    att = write_attribution(args.run_dir, args.lineage)
    if att is None:
        print("attribution: no data_lineage.json next to the checkpoints (pass --lineage FILE to attribute "
              "changes to data windows)", file=sys.stderr)
    else:
        fam = att["families"]
        print(fam.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(f"attribution: {att['files'][0]} (windows from {att['lineage']})")
    return 0


def _cmd_average(args: argparse.Namespace) -> int:
    from .average import average_checkpoints

    paths = average_checkpoints(args.ckpt_dir, window=args.window, out_dir=args.out, mode=args.mode,
                                overwrite=args.overwrite, progress=not args.no_progress)
    for p in paths:
        print(p)
    print(f"{len(paths)} averaged checkpoint(s) (window {args.window}, {args.mode}) in "
          f"{paths[0].parent if paths else args.out}", file=sys.stderr)
    return 0


def _cmd_shortlist(args: argparse.Namespace) -> int:
    from .shortlist import shortlist

    res = shortlist(args.run_dir, args.plan, out_dir=args.out)
    cols = [c for c in ("checkpoint", "step", "aggregate_rank", "one_probe_winner", "passes_constraints",
                        "selected", "reason") if c in res.table.columns]
    with __import__("pandas").option_context("display.width", 200, "display.max_colwidth", 80):
        print(res.table[cols].to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    for note in res.notes:
        print(f"note: {note}", file=sys.stderr)
    print(f"shortlist: {', '.join(res.selected) or '(none)'} -> {res.csv_path}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    md, html = write_report(args.run_dir, averaged_run_dir=args.averaged)
    print(f"report: {md} and {html}")
    return 0


def _add_toy_ladder_parser(sub) -> None:
    t = sub.add_parser("toy-ladder", help="pretrain the built-in toy checkpoint ladder on CPU",
                       description="Pretrain a small Llama-architecture LM on the synthetic toy world and save "
                                   "checkpoint-<step> folders plus SFT/transfer/held-out data under OUT_DIR/data/.")
    t.add_argument("out_dir", metavar="OUT_DIR", help="where to write checkpoint-<step>/ folders and data/")
    t.add_argument("--seed", type=int, default=0, help="world, data and init seed (default 0)")
    t.add_argument("--steps", type=int, default=None,
                   help="optimizer steps (default 2000 for a built-in curriculum, else the last window's end_step)")
    t.add_argument("--save-every", type=int, default=None, help="save a checkpoint every K steps (default 200)")
    t.add_argument("--curriculum", default=None, metavar="YAML|planted|uniform|late-harm|negative-control",
                   help="data windows and their document mixtures (default: the built-in planted curriculum "
                        "= recipes/ladder-planted.yaml, with a parrot window; 'uniform' = the default mix "
                        "throughout; 'late-harm' = recipes/ladder-late-harm.yaml, a harmful final window; "
                        "'negative-control' = recipes/ladder-negative-control.yaml, late damage on operands no "
                        "probe uses); writes OUT_DIR/data_lineage.json")
    t.add_argument("--threads", type=int, default=None,
                   help="torch threads (default 1 or $PROBESELECT_TOY_THREADS; fixed so rebuilds are byte-identical)")
    t.add_argument("--arch", default="llama", choices=["llama", "gpt_neox", "gpt2", "olmo2"],
                   help="model family (default llama): the same corpus, tokenizer and curriculum on a same-size "
                        "GPT-NeoX (Pythia), GPT-2 or OLMo2 model")
    t.add_argument("--tokenizer-corpus", default="curriculum", choices=["curriculum", "reference"],
                   help="what the BPE tokenizer learns from: 'curriculum' (default) = this ladder's own documents, "
                        "so another curriculum changes every checkpoint; 'reference' = the default mix of the "
                        "seed's world, independent of the curriculum, so curricula that share a first window "
                        "share its checkpoints (compare curricula with this)")
    t.add_argument("--no-progress", action="store_true", help="hide progress bars")
    t.set_defaults(func=_cmd_toy_ladder)


def _add_score_parser(sub) -> None:
    s = sub.add_parser("score", help="score a directory of checkpoints with conflict probes",
                       description="Score every checkpoint in CKPT_DIR with the given probe specs under each "
                                   "evaluation seed; writes items.jsonl, scores.parquet, summary.csv and "
                                   "manifest.json to --out. Re-runs reuse cached per-checkpoint scores.")
    s.add_argument("ckpt_dir", metavar="CKPT_DIR",
                   help="a folder of checkpoints, one model folder, or a Hub repo ORG/NAME with --revisions")
    s.add_argument("--revisions", nargs="+", default=None, metavar="REV",
                   help="CKPT_DIR is a Hub repo: score these revisions (branches such as step1000 or "
                        "stage1-step1000-tokens4B), or `all` (every revision whose name carries a step); "
                        "offline (HF_HUB_OFFLINE=1) they must be in the local HF cache")
    s.add_argument("--revision-pattern", default=None, metavar="GLOB",
                   help="CKPT_DIR is a Hub repo: score the revisions matching GLOB, e.g. 'stage1-step*'")
    s.add_argument("--probes", nargs="+", required=True, metavar="SPEC",
                   help="probe spec YAML files or folders (probes/*.yaml), or the name of a spec shipped with the "
                        "package, usable from any directory: `real` (every real-LM family), `capability`, or a "
                        "family such as real_successive (`probeselect probes list` shows them)")
    s.add_argument("--out", default=None, help="run folder (default results/<CKPT_DIR name>)")
    add_scoring_options(s)  # --seeds --dtype --device --max-batch-tokens --heldout --heldout-stride --audit-items
    s.add_argument("--no-prefix-reuse", action="store_true",
                   help="run every prompt in full; by default prompts of a work unit that share a token prefix of "
                        ">= 32 tokens (e.g. fixed demonstrations) run that prefix once and reuse its KV cache, and "
                        "prompts of sampled/greedy generation sharing >= 16 tokens prefill them once")
    s.add_argument("--max-prefix-cache-tokens", type=int, default=32768, metavar="N",
                   help="bound on shared-prefix KV tokens expanded at once (rows x prefix length); a longer "
                        "prefix is scored without reuse (default 32768)")
    s.add_argument("--chunk-items", type=int, default=1024,
                   help="items per work unit, the grain of caching, resuming and multi-process sharding (default 1024)")
    s.add_argument("--keep-going", action="store_true",
                   help="skip (and record) checkpoints that fail to load instead of stopping")
    s.add_argument("--max-length", type=int, default=None, help="context limit in tokens (default: the model's)")
    s.add_argument("--on-overflow", choices=["error", "truncate"], default="error",
                   help="a prompt longer than the context: stop with an error naming the items (default), or cut it "
                        "from the left as lm-eval does (recorded as truncated_tokens per item, counted in summary.csv)")
    s.add_argument("--calibrate", action="store_true",
                   help="also score the content-free reference <family>_cf of every calibrated family (real_truthy, "
                        "real_flipped, real_successive, real_repetitive, real_intuitive, arith_pattern): the chance reference of its "
                        "margins (contextual calibration; the report shows raw and calibrated margins side by side)")
    s.add_argument("--tokenizer", default=None, help="tokenizer folder, for checkpoints saved without one")
    s.add_argument("--allow-tokenizer-mismatch", action="store_true",
                   help="score checkpoints even if their tokenizers differ")
    s.add_argument("--fingerprint", choices=["sampled", "full"], default="sampled",
                   help="checkpoint fingerprint for the cache keys: sampled (default; headers plus samples of "
                        "every tensor) or full (sha256 of every weight byte; one full read of the weights)")
    s.add_argument("--shard", default=None, metavar="I/N",
                   help="job arrays: score only the I-th of N disjoint shares of the work units (1 <= I <= N) into "
                        "the shared --out folder; the shard that completes the plan writes the final tables")
    s.add_argument("--merge", action="store_true",
                   help="write the final tables from the shards' cache (no model work); refuses and names the "
                        "missing shards unless every unit is scored. Use the shards' flags.")
    s.add_argument("--no-progress", action="store_true", help="hide progress bars")
    s.set_defaults(func=_cmd_score)


def _add_probes_parser(sub) -> None:
    pr = sub.add_parser("probes", help="list, validate and show probe families (no model needed)",
                        description="Inspect probe families: list what is registered, validate spec and data "
                                    "files, and print rendered items exactly as the model sees them.")
    prs = pr.add_subparsers(dest="probes_command", required=True, metavar="ACTION")
    pl = prs.add_parser("list", help="every registered family and variant with its item count")
    pl.add_argument("--dir", default=None,
                    help="also list user families under this folder (default: probes/ if the current folder has one)")
    pv = prs.add_parser("validate", help="check spec YAML and data files without loading a model")
    pv.add_argument("files", nargs="+", metavar="FILE", help="spec files or folders (searched for *.yaml)")
    ps = prs.add_parser("show", help="print rendered items of a family or spec file")
    ps.add_argument("family", metavar="FAMILY", help="a registered family name or a spec YAML path")
    ps.add_argument("--seed", type=int, default=0, help="evaluation seed (default 0)")
    ps.add_argument("-n", type=int, default=3, help="items per variant (default 3)")
    ps.add_argument("--variant", default=None, help="only this variant")
    pr.set_defaults(func=_cmd_probes)


def _add_dynamics_parser(sub) -> None:
    d = sub.add_parser("dynamics", help="mode-hopping, signal/noise and correlation statistics of a scored run",
                       description="Read RUN_DIR's scoring tables and write dynamics.csv, trajectories.csv, "
                                   "pairs.csv, correlation.csv and plots into RUN_DIR/dynamics/.")
    d.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by `probeselect score`")
    d.add_argument("--noise-window", type=int, default=5, help="last W checkpoints used for the noise estimate (default 5)")
    d.add_argument("--hop-k", type=float, default=3.0, metavar="K",
                   help="hop threshold in standard errors of a checkpoint-to-checkpoint difference (from the "
                        "evaluation-seed sd; default 3): both legs of a hop must move more than this")
    d.add_argument("--min-hop", type=float, default=0.1, metavar="NATS",
                   help="smallest leg of a margin hop in nats, whatever the seed noise (default 0.1)")
    d.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    d.add_argument("--lineage", default=None, metavar="FILE",
                   help="data windows for attribution: a data_lineage.json or a CSV start_step,end_step,window "
                        "(default: data_lineage.json next to the scored checkpoints, if any); writes "
                        "dynamics/attribution.csv and attribution_families.csv")
    d.set_defaults(func=_cmd_dynamics)


def _add_average_parser(sub) -> None:
    a = sub.add_parser("average", help="write uniform averages of K consecutive checkpoints",
                       description="Average the weights of every window of K consecutive checkpoints of CKPT_DIR "
                                   "into standard HF folders whose metadata names the sources.")
    a.add_argument("ckpt_dir", metavar="CKPT_DIR", help="a folder of checkpoints")
    a.add_argument("--window", type=int, default=5, metavar="K", help="checkpoints per average (default 5)")
    a.add_argument("--out", default=None, help="output folder (default <CKPT_DIR>-avg<K>)")
    a.add_argument("--mode", choices=["sliding", "disjoint"], default="sliding",
                   help="sliding windows (n-K+1 outputs, default) or disjoint windows")
    a.add_argument("--overwrite", action="store_true", help="recompute existing averaged folders")
    a.add_argument("--no-progress", action="store_true", help="hide progress bars")
    a.set_defaults(func=_cmd_average)


def _add_shortlist_parser(sub) -> None:
    sl = sub.add_parser("shortlist", help="shortlist bases across probes and prompt variants under a plan",
                        description="Rank checkpoints on the plan's proxies, apply its constraints, flag one-probe "
                                    "winners and write shortlist.csv / shortlist.json.")
    sl.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by `probeselect score`")
    sl.add_argument("--plan", required=True, help="selection plan YAML, e.g. recipes/selection.yaml")
    sl.add_argument("--out", default=None, help="output folder (default RUN_DIR)")
    sl.set_defaults(func=_cmd_shortlist)


def _add_report_parser(sub) -> None:
    r = sub.add_parser("report", help="write report.md and a self-contained report.html for a run",
                       description="Write RUN_DIR/report.md and RUN_DIR/report.html (plots embedded).")
    r.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by `probeselect score`")
    r.add_argument("--averaged", default=None, help="scored run of averaged checkpoints to compare against")
    r.set_defaults(func=_cmd_report)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="probeselect",
        description="Choose which saved pretraining checkpoint to post-train.",
    )
    p.add_argument("--version", action="version", version=f"probeselect {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_toy_ladder_parser(sub)
    _add_score_parser(sub)
    _add_probes_parser(sub)
    _add_dynamics_parser(sub)
    _add_average_parser(sub)
    _add_shortlist_parser(sub)
    _add_report_parser(sub)
    __import__("probeselect.sft._cli", fromlist=["add_parsers"]).add_parsers(sub)  # pilot
    __import__("probeselect._select_cli", fromlist=["add_parsers"]).add_parsers(sub)  # plan lock, select, confirm, run
    __import__("probeselect._watch_cli", fromlist=["add_parsers"]).add_parsers(sub)  # watch, export
    return p


def _sigterm_as_interrupt(signum, frame):  # job schedulers stop jobs with SIGTERM: treat it like Ctrl-C
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Bad input is a one-line ``error:`` message and exit code 2;
    Ctrl-C or SIGTERM prints how to resume and exits 130; other exceptions are bugs and
    keep their traceback."""
    args = build_parser().parse_args(argv)
    # before any CUDA work: cuBLAS reads it when its first handle is made; deterministic cuBLAS needs it,
    # though it alone does not make a GPU run bitwise reproducible (bench/README.md, "Ninth session").
    # A user's own value is kept. = pilot.CUBLAS_WORKSPACE (not imported: that module pulls in torch,
    # and `--help` should not)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    prog = f"probeselect {args.command}"
    old_term = None
    try:
        old_term = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    except ValueError:  # not the main thread (e.g. called from a worker thread): leave signals alone
        pass
    try:
        return args.func(args)
    except ProbeselectError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        saved = f"{exc.units_saved} units saved; " if isinstance(exc, RunInterrupted) else ""
        print(f"\n{prog}: interrupted; {saved}re-run the same command to resume", file=sys.stderr)
        return 130
    except UnicodeDecodeError as exc:  # last resort: the reader did not name the file
        print(f"{prog}: error: an input file is not UTF-8 text ({exc.reason} at byte {exc.start}); "
              "re-save it as UTF-8.", file=sys.stderr)
        return 2
    except OSError as exc:  # last resort: unreadable/missing file, full disk, permission denied
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"{prog}: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


if __name__ == "__main__":
    sys.exit(main())
