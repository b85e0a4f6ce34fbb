"""Mutation check: put known mistakes back one at a time and check that the tests catch them.

Each mutation below names a source file, an exact piece of text in it, the text that replaces
it, and the test files that must fail when the replacement is in place. The script copies the
repository's tracked and untracked-but-not-ignored files to a temporary folder (the working
tree is never modified), checks that the named tests pass on the unmutated copy, then for each
mutation applies it to the copy, runs only its test files, restores the file, and reports:

* ``killed``            - a named test failed (the first failing test and its message are shown);
* ``survived``          - every named test passed with the mistake in place;
* ``equivalent``        - survived, and the mutation is known to change no observable result (the
                          reason is printed; re-check it when the code changes);
* ``pattern missing``   - the old text is not in the file nor anywhere else under src/ (the code
                          moved or changed: update the pattern; this is NOT a kill);
* ``pattern ambiguous`` - the old text occurs more than once, so the mutation is not applied;
* ``tests missing``     - a named test file does not exist;
* ``timeout``           - the tests ran past ``--timeout`` seconds.

When the old text is not in the named file but occurs exactly once in another file under
``src/`` (code moved between modules), the mutation is applied there and the row says so.

Usage (from the repository root; uses the Python running it, which must have the test deps):

    PYTHONPATH=src nice -n 10 python bench/mutations.py            # all mutations
    PYTHONPATH=src python bench/mutations.py --only bonferroni,tie_margin_ge
    python bench/mutations.py --list

Exit status: 0 when every mutation is killed or a documented equivalent, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str          # path relative to the repository root (a hint: see the module docstring)
    old: str           # exact text, must occur exactly once
    new: str
    tests: tuple[str, ...]
    why: str           # the mistake it models
    equivalent: str = ""  # non-empty: known to change no observable result, and why


MUTATIONS: list[Mutation] = [
    # --- the five mutations of issue 29 ---------------------------------------------------------
    Mutation("bonferroni", "src/probeselect/select.py",
             "(1 - level) / (2 * (k - 1))", "(1 - level) / 2",
             ("tests/test_decisions.py", "tests/test_select.py"),
             "compare_top without the Bonferroni factor over the k - 1 comparisons"),
    Mutation("shortcut_wrong_candidate", "src/probeselect/score.py",
             "task, short = sc[0], sc[1]", "task, short = sc[0], sc[-1]",
             ("tests/test_score_independent.py",),
             "shortcut_logprob taken from the last candidate instead of the shortcut"),
    Mutation("margin_per_token_swapped", "src/probeselect/score.py",
             "task.logprob / task.n_tokens - short.logprob / short.n_tokens",
             "task.logprob / short.n_tokens - short.logprob / task.n_tokens",
             ("tests/test_score_independent.py",),
             "margin_per_token with the two token counts swapped"),
    Mutation("summary_seed_bootstrap", "src/probeselect/tables.py",
             'per_item = g.groupby("item_id")["margin"].mean().to_numpy()',
             'per_item = g.groupby("seed")["margin"].mean().to_numpy()',
             ("tests/test_decisions.py", "tests/test_tables.py"),
             "summary interval bootstrapped over evaluation seeds instead of items"),
    Mutation("hop_floor_every_track", "src/probeselect/dynamics.py",
             "min_hop=min_hop_nats if is_margin else 0.0", "min_hop=min_hop_nats",
             ("tests/test_decisions.py", "tests/test_dynamics.py"),
             "the 0.1-nat hop floor applied to every track, not only margin tracks",
             equivalent="only margin tracks carry a seed sd (track_table gives bits-per-byte and generation "
                        "tracks none), and hop_threshold is NaN without one whatever the floor, so a floor on "
                        "those tracks changes nothing; tests/test_decisions.py::"
                        "test_hop_floor_applies_to_margin_tracks_only pins that they stay NaN"),
    # --- more on central code -------------------------------------------------------------------
    Mutation("hop_floor_dropped", "src/probeselect/dynamics.py",
             "min_hop=min_hop_nats if is_margin else 0.0", "min_hop=0.0",
             ("tests/test_decisions.py", "tests/test_dynamics.py"),
             "no hop floor on margin tracks"),
    Mutation("tie_margin_ge", "src/probeselect/select.py",
             "axis=-1) > tie_margin", "axis=-1) >= tie_margin",
             ("tests/test_decisions.py", "tests/test_select.py"),
             "a lower bound equal to the tie margin counted as a clear win"),
    Mutation("winner_vs_worst_only", "src/probeselect/select.py",
             "return np.nanmin(np.where(np.isnan(lo), -np.inf, lo), axis=-1) > tie_margin",
             "return np.nanmax(np.where(np.isnan(lo), -np.inf, lo), axis=-1) > tie_margin",
             ("tests/test_run_decisions.py", "tests/test_decisions.py"),
             "the winner rule checks the interval against the worst base instead of every other base"),
    Mutation("ranking_reversed", "src/probeselect/select.py",
             'order = np.argsort(-v.mean(axis=-1), axis=-1, kind="stable")',
             'order = np.argsort(v.mean(axis=-1), axis=-1, kind="stable")',
             ("tests/test_run_decisions.py",),
             "compare_top ranks the worst base first"),
    Mutation("paired_t_ddof0", "src/probeselect/select.py",
             "sd = d.std(axis=-1, ddof=1)", "sd = d.std(axis=-1, ddof=0)",
             ("tests/test_decisions.py", "tests/test_select.py"),
             "paired-t sd without Bessel's correction"),
    Mutation("paired_t_df", "src/probeselect/select.py",
             "/ (2 * (k - 1)), n - 1))", "/ (2 * (k - 1)), n))",
             ("tests/test_decisions.py", "tests/test_select.py"),
             "paired-t quantile with n instead of n - 1 degrees of freedom"),
    Mutation("paired_t_sqrt_n", "src/probeselect/select.py",
             "half = crit * sd / math.sqrt(n)", "half = crit * sd / math.sqrt(n - 1)",
             ("tests/test_decisions.py", "tests/test_select.py"),
             "paired-t standard error divided by sqrt(n - 1)"),
    Mutation("min_sft_seeds_off_by_one", "src/probeselect/select.py",
             "elif n_s < spec.min_sft_seeds:\n            verdict", "elif n_s < spec.min_sft_seeds - 1:\n            verdict",
             ("tests/test_select.py",),
             "a winner named with one seed fewer than the plan's minimum"),
    Mutation("zigzag_first_leg_ge", "src/probeselect/dynamics.py",
             "if m[hi] - m[lo] > h:", "if m[hi] - m[lo] >= h:",
             ("tests/test_decisions.py", "tests/test_dynamics.py"),
             "a first move of exactly the threshold counted as a leg"),
    Mutation("zigzag_turn_ge", "src/probeselect/dynamics.py",
             "elif m[hi] - x > h:", "elif m[hi] - x >= h:",
             ("tests/test_decisions.py", "tests/test_dynamics.py"),
             "a fall of exactly the threshold confirmed as a turning point"),
    Mutation("hop_threshold_sqrt2", "src/probeselect/dynamics.py",
             "k * math.sqrt(2.0 / n.min()) * pooled", "k * math.sqrt(1.0 / n.min()) * pooled",
             ("tests/test_decisions.py", "tests/test_dynamics.py"),
             "hop threshold from the sd of one checkpoint value, not of a difference of two"),
    Mutation("hops_count_legs", "src/probeselect/dynamics.py",
             "float(len(legs) // 2)", "float(max(len(legs) - 1, 0))",
             ("tests/test_decisions.py", "tests/test_dynamics.py"),
             "every turning point counted as a hop (overlapping excursions)"),
    Mutation("bootstrap_one_sided_alpha", "src/probeselect/tables.py",
             "alpha = (1 - level) / 2", "alpha = 1 - level",
             ("tests/test_decisions.py", "tests/test_tables.py"),
             "a 90% interval reported as 95%"),
    Mutation("probes_vs_pilot_sign", "src/probeselect/final_report.py",
             "if rho is not None and rho <= 0:", "if rho is not None and rho < -1:",
             ("tests/test_final_report.py",),
             "a probe aggregate that orders the piloted bases against transfer not said to have failed"),
    Mutation("best_proxy_includes_aggregate", "src/probeselect/final_report.py",
             "single = [p for p in pv if p is not agg]", "single = list(pv)",
             ("tests/test_final_report.py",),
             "the shortlist aggregate offered as the best-agreeing single proxy"),
    Mutation("window_end_first_not_last", "src/probeselect/plan.py",
             "max(inside, key=lambda c: (steps[c], cands.index(c)))", "min(inside, key=lambda c: (steps[c], cands.index(c)))",
             ("tests/test_shortlist.py",),
             "references: [window_ends] piloting the first base of each data window instead of the last"),
    Mutation("window_end_open_at_the_end", "src/probeselect/attribution.py",
             "self.start_step < step <= self.end_step", "self.start_step < step < self.end_step",
             ("tests/test_shortlist.py",),
             "a checkpoint saved at a window's end_step not counted in that window (the base before the change missed)"),
    Mutation("summary_counts_references_as_shortlisted", "src/probeselect/_probe_sections.py",
             'short = [c for c in sel["checkpoint"] if str(c) not in refs]', 'short = list(sel["checkpoint"])',
             ("tests/test_report.py",),
             "the report's Summary counting the naive choices piloted next to the shortlist as shortlisted"),
]


def repo_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout.decode()
    return [f for f in out.split("\0") if f and (root / f).is_file()]


def copy_repo(root: Path, dest: Path) -> None:
    for f in repo_files(root):
        if f.startswith("results/"):  # example outputs: large, and no test reads them from the copy
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, dest / f)


def locate(copy: Path, m: Mutation) -> tuple[Path | None, str]:
    """The file to mutate and a status: 'ok', 'moved', 'missing' or 'ambiguous'."""
    hint = copy / m.file
    if hint.is_file():
        n = hint.read_text(encoding="utf-8").count(m.old)
        if n == 1:
            return hint, "ok"
        if n > 1:
            return hint, "ambiguous"
    hits = [(p, p.read_text(encoding="utf-8").count(m.old)) for p in sorted((copy / "src").rglob("*.py"))]
    hits = [(p, n) for p, n in hits if n]
    if len(hits) == 1 and hits[0][1] == 1:
        return hits[0][0], "moved"
    return (None, "ambiguous") if hits else (None, "missing")


def run_tests(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, str, float]:
    """('pass' | 'fail' | 'timeout', first failure line, seconds)."""
    env = dict(os.environ, PYTHONPATH=str(copy / "src"), PYTHONDONTWRITEBYTECODE="1", COLUMNS="400",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-rf", "--tb=line", *tests]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", "", time.monotonic() - t0
    dt = time.monotonic() - t0
    if r.returncode == 0:
        return "pass", "", dt
    text = r.stdout + r.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)(?: - (.*))?$", text, re.M)
    if failed:
        name, msg = failed[0]
        return "fail", f"{name}: {(msg or '').strip()[:160]}", dt
    tail = [l for l in text.splitlines() if l.strip()][-1:] or ["(no output)"]
    return "fail", f"pytest exit {r.returncode}: {tail[0][:160]}", dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated mutation names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per test run (default 900)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the run of the named tests on the unmutated copy (only when you just saw them pass)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    args = ap.parse_args(argv)
    chosen = MUTATIONS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {m.name for m in MUTATIONS})
        if unknown:
            ap.error(f"unknown mutation(s) {unknown}; --list shows the names")
        chosen = [m for m in MUTATIONS if m.name in names]
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:28s} {m.file}: {m.why}")
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="probeselect-mutations-"))
    copy = tmp / "repo"
    rows, ok = [], True
    try:
        copy_repo(ROOT, copy)
        all_tests = tuple(dict.fromkeys(t for m in chosen for t in m.tests if (copy / t).is_file()))
        status, line, dt = ("skipped", "", 0.0) if args.no_baseline else run_tests(copy, all_tests, args.timeout)
        print(f"baseline (unmutated copy): {status} in {dt:.0f} s: {' '.join(all_tests)}", flush=True)
        if status not in ("pass", "skipped"):
            print(f"the tests fail without any mutation ({line}); fix them first.", file=sys.stderr)
            return 2
        for m in chosen:
            missing_tests = [t for t in m.tests if not (copy / t).is_file()]
            target, where = locate(copy, m)
            note, dt = "", 0.0
            if missing_tests:
                result, note = "tests missing", ", ".join(missing_tests)
            elif where in ("missing", "ambiguous"):
                result = f"pattern {where}"
                note = f"{m.old!r} in {m.file}"
            else:
                original = target.read_text(encoding="utf-8")
                target.write_text(original.replace(m.old, m.new, 1), encoding="utf-8")
                try:
                    status, line, dt = run_tests(copy, m.tests, args.timeout)
                finally:
                    target.write_text(original, encoding="utf-8")
                result = {"fail": "killed", "pass": "survived", "timeout": "timeout"}[status]
                if result == "survived" and m.equivalent:
                    result, line = "equivalent", m.equivalent
                note = line + (f" (applied in {target.relative_to(copy)}: code moved)" if where == "moved" else "")
            ok &= result in ("killed", "equivalent")
            rows.append((m.name, result, f"{dt:.0f}", note))
            print(f"{m.name}: {result} ({dt:.0f} s) {note}", flush=True)
    finally:
        if args.keep:
            print(f"copy kept at {copy}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print("\n| mutation | result | s | first failing test / note |\n|---|---|---|---|")
    for name, result, secs, note in rows:
        print(f"| {name} | {result} | {secs} | {note.replace('|', '/')} |")
    survivors = [r[0] for r in rows if r[1] not in ("killed", "equivalent")]
    print(f"\n{sum(r[1] == 'killed' for r in rows)} killed, {sum(r[1] == 'equivalent' for r in rows)} equivalent, "
          f"{len(survivors)} not killed{': ' + ', '.join(survivors) if survivors else ''}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
