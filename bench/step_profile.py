"""Where an SFT step's time goes, batched seeds vs one seed at a time, on CPU or CUDA (issue 26).

Run: python bench/step_profile.py LADDER [--checkpoint N] [--device cpu|cuda] [--steps 100]
     [--seeds 0 1 2] [--modes packed single] [--torch-profile 30] [--repeat 2] [--out DIR]

One base of LADDER (a toy ladder folder; default its last checkpoint) is trained by ``run_pilot``
with recipes/confirm.yaml (data and transfer from LADDER/data, ``budget.optimizer_steps=--steps``),
once per mode: ``packed`` (batched seeds, packed rows: the default), ``padded`` (batched seeds, padded
rows) and ``single`` (``batch_seeds=false``, the reference loop). The library's own functions are
wrapped with timers (on CUDA each wrapper synchronises before and after, so a part's time is its
own kernels' and not a later part's; this adds syncs that the plain run does not have):

  data        building the micro-batches (pack_rows / collate)
  forward     the model's forward and the supervised NLL (rows_nll / microbatch_nll)
  backward    every ``Tensor.backward``
  norms       gradient norms, global and per layer (grad_norms_many / grad_norms)
  clip+adamw  clipping, AdamW and the schedule (clip_and_step)
  update norm the update-norm buffers (UpdateNorms.before + after)
  heldout     held-out loss every ``eval.every`` steps
  state       full-state checkpoints (RunBook.save)
  log         the rest of RunBook.log (the jsonl row, lineage)
  other       train_s minus the parts above (loop bookkeeping, host syncs, Python)

``train_s`` is the stage's training time (diagnostics.csv ``seconds``; batched steps are split
evenly among their seeds, so it sums to the batched wall time); ``wall_s`` adds loading, transfer
evaluation and outputs. ``--torch-profile N`` then reruns each mode for N steps under
``torch.profiler`` (CPU, and CUDA activity on a GPU), switched on only inside the training call
(``train_seeds`` / ``train``: model loading and LoRA set-up included, transfer evaluation and outputs
not), and prints the top ops by self time (``single``: the first seed's run only).

``--repeat 2`` trains each mode twice into fresh folders and compares the two runs: every
train_log.jsonl field except wall-clock ones and the final adapter tensors, bitwise. Warnings raised
during the runs are printed once each (a CUDA op without a deterministic kernel names itself there:
the pilot trains under ``torch.use_deterministic_algorithms(True, warn_only=True)``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: parts outside diagnostics.csv ``seconds`` (train_s): both loops stop a step's clock after the update
#: norm, before the held-out loss, the log row and the state writes
OUTSIDE = dict.fromkeys(["single", "packed", "padded"], {"heldout", "state", "log"})
PARTS = ["data", "forward", "backward", "norms", "clip+adamw", "update norm", "heldout", "state", "log"]
_CLOCK_FIELDS = {"seconds", "time", "timestamp", "wall_s", "tok_s", "elapsed_s"}


class Timers:
    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.s = collections.defaultdict(float)
        self.n = collections.Counter()
        self.depth = 0

    def sync(self):
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def wrap(self, part: str, fn, nested: bool = False):
        """Time ``fn`` as ``part`` when it is called outside every other timed part (a forward inside
        the held-out loss counts as held-out time), or always with ``nested`` (a state save inside
        RunBook.log, subtracted from it afterwards)."""
        @functools.wraps(fn)
        def timed(*a, **k):
            if self.depth and not nested:
                return fn(*a, **k)
            self.sync()
            self.depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.sync()
                self.depth -= 1
                self.s[part] += time.perf_counter() - t0
                self.n[part] += 1

        return timed


@contextlib.contextmanager
def training_only(prof):
    """Run ``prof`` (a torch.profiler.profile) only inside the pilot's training call (which loads the base
    and sets up LoRA; not during the pilot's pre-flight, transfer evaluation or outputs)."""
    from probeselect import pilot

    saved = (pilot.train_seeds, pilot.train)

    def on(fn):
        @functools.wraps(fn)
        def inner(*a, **k):
            prof.start()
            try:
                return fn(*a, **k)
            finally:
                prof.stop()

        return inner

    pilot.train_seeds, pilot.train = on(pilot.train_seeds), on(pilot.train)
    try:
        yield
    finally:
        pilot.train_seeds, pilot.train = saved


@contextlib.contextmanager
def patched(timers: Timers):
    """Wrap the training loops' parts with ``timers`` (restored on exit)."""
    import torch

    from probeselect.sft import _runbook, batched, diagnostics, loop

    saved = []

    def put(obj, name, part, nested=False):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, timers.wrap(part, getattr(obj, name), nested))

    put(batched, "pack_rows", "data")
    put(batched, "collate", "data")
    put(loop, "collate", "data")
    put(batched, "rows_nll", "forward")
    put(loop, "microbatch_nll", "forward")
    put(torch.Tensor, "backward", "backward")
    put(batched, "grad_norms_many", "norms")
    put(loop, "grad_norms", "norms")
    put(batched, "clip_and_step", "clip+adamw")
    put(loop, "clip_and_step", "clip+adamw")
    put(diagnostics.UpdateNorms, "before", "update norm")
    put(diagnostics.UpdateNorms, "after", "update norm")
    put(batched, "_heldout_losses", "heldout")
    put(loop, "heldout_loss", "heldout")
    put(_runbook.RunBook, "save", "state", nested=True)
    put(_runbook.RunBook, "log", "log+state")
    try:
        yield
    finally:
        for obj, name, fn in reversed(saved):
            setattr(obj, name, fn)


def stage(ladder: Path, base: Path, mode: str, steps: int, seeds, device: str, out: Path):
    """One run_pilot of recipes/confirm.yaml on ``base``; returns (result, wall seconds)."""
    from probeselect.pilot import run_pilot
    from probeselect.sft import batched

    was, batched.PACKED = batched.PACKED, mode != "padded"
    d = ladder / "data"
    over = [f"data.train={d / 'sft.jsonl'}", f"transfer.tasks={d / 'transfer.jsonl'}",
            f"transfer.robustness={d / 'robustness.jsonl'}", f"transfer.heldout={d / 'sft_heldout.jsonl'}",
            f"budget.optimizer_steps={steps}", f"batch_seeds={'false' if mode == 'single' else 'true'}",
            f"seeds=[{','.join(str(s) for s in seeds)}]"]
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    try:
        res = run_pilot([base], REPO / "recipes" / "confirm.yaml", out, progress=False, device=device,
                        overrides=over, jobs=1)
    finally:
        batched.PACKED = was
    return res, time.perf_counter() - t0


def compare_runs(a: Path, b: Path) -> tuple[list[str], int, int]:
    """Differences between two pilot folders: train_log.jsonl fields (clock fields excluded) and the
    trainable tensors of every kept state (``state/step-*/*.safetensors``; not the optimizer state),
    bitwise; with the numbers of log rows and tensors compared."""
    import torch
    from safetensors.torch import load_file

    diffs, n_rows, n_tensors = [], 0, 0
    logs_a = sorted(a.rglob("train_log.jsonl"))
    if not logs_a:
        return [f"no train_log.jsonl under {a}"], 0, 0
    for la in logs_a:
        lb = b / la.relative_to(a)
        ra = [json.loads(x) for x in la.read_text().splitlines() if x.strip()]
        rb = [json.loads(x) for x in lb.read_text().splitlines() if x.strip()] if lb.exists() else []
        if len(ra) != len(rb):
            diffs.append(f"{la.relative_to(a)}: {len(ra)} vs {len(rb)} rows")
            continue
        n_rows += len(ra)
        for x, y in zip(ra, rb):
            for k in sorted(set(x) | set(y)):
                if k not in _CLOCK_FIELDS and not k.endswith("_s") and x.get(k) != y.get(k):
                    diffs.append(f"{la.relative_to(a)} step {x.get('step')} field {k}: {x.get(k)!r} vs {y.get(k)!r}")
    for fa in sorted(a.rglob("state/step-*/*.safetensors")):
        fb = b / fa.relative_to(a)
        ta, tb = load_file(str(fa)), (load_file(str(fb)) if fb.exists() else {})
        n_tensors += len(ta)
        for k in sorted(set(ta) | set(tb)):
            if k not in ta or k not in tb or not torch.equal(ta[k], tb[k]):
                diffs.append(f"{fa.relative_to(a)}: tensor {k} differs")
    return diffs, n_rows, n_tensors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ladder", type=Path)
    ap.add_argument("--checkpoint", type=int, default=None, help="step of the base (default: the last)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--modes", nargs="+", default=["packed", "single"], choices=["packed", "padded", "single"])
    ap.add_argument("--torch-profile", type=int, default=0, metavar="N", help="profile N steps per mode")
    ap.add_argument("--repeat", type=int, default=1, help="2: train each mode twice and compare bitwise")
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench-step-profile"))
    args = ap.parse_args(argv)

    import torch

    sys.path.insert(0, str(REPO / "src"))
    cps = sorted((p for p in args.ladder.glob("checkpoint-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1]))
    base = args.ladder / f"checkpoint-{args.checkpoint}" if args.checkpoint is not None else cps[-1]
    cuda = args.device.startswith("cuda")
    print(f"torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if cuda else f", {torch.get_num_threads()} threads at start")
          + f"; base {base}; {args.steps} steps x seeds {args.seeds}", flush=True)
    seen = collections.Counter()

    def note(message, category, filename, lineno, file=None, line=None):
        seen[f"{category.__name__}: {message} ({Path(filename).name}:{lineno})"] += 1

    results = {}
    old_show = warnings.showwarning
    warnings.showwarning = note
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note
            for mode in args.modes:
                for rep in range(args.repeat):
                    timers = Timers(cuda)
                    with patched(timers):
                        res, wall = stage(args.ladder, base, mode, args.steps, args.seeds, args.device,
                                          args.out / f"{mode}-{rep}")
                    train = float(res.diagnostics["seconds"].sum())
                    s = dict(timers.s)
                    s["log"] = s.pop("log+state", 0.0) - s.get("state", 0.0)
                    # train_s counts neither the held-out loss nor (single) the checkpoint/log writes after it
                    s["other"] = train - sum(s.get(p, 0.0) for p in PARTS if p not in OUTSIDE[mode])
                    run_steps = args.steps * len(args.seeds)
                    results[f"{mode}-{rep}"] = {"wall_s": round(wall, 2), "train_s": round(train, 2),
                                                "ms_per_run_step": round(1e3 * train / run_steps, 2),
                                                "parts_s": {k: round(v, 3) for k, v in s.items()},
                                                "calls": dict(timers.n),
                                                "final_loss_mean": float(res.diagnostics["final_loss"].mean())}
                    print(f"\n{mode} (run {rep}): wall {wall:.1f} s, train {train:.2f} s "
                          f"({1e3 * train / run_steps:.1f} ms per run-step), final loss mean "
                          f"{results[f'{mode}-{rep}']['final_loss_mean']:.8f}", flush=True)
                    for p in PARTS + ["other"]:
                        v = s.get(p, 0.0)
                        print(f"  {p:<12} {v:8.3f} s  {100 * v / max(train, 1e-9):5.1f}%  "
                              f"({timers.n.get(p if p != 'log' else 'log+state', 0)} calls)"
                              + ("  not in train_s" if p in OUTSIDE[mode] else ""))
                if args.repeat > 1:
                    diffs, n_rows, n_tensors = compare_runs(args.out / f"{mode}-0", args.out / f"{mode}-1")
                    results[f"{mode}-rerun-differences"] = diffs[:50]
                    print(f"  rerun vs first run ({n_rows} log rows, {n_tensors} state tensors): "
                          f"{'bitwise equal' if not diffs else f'{len(diffs)} differences'}")
                    for d in diffs[:12]:
                        print("   ", d)
            if args.torch_profile:
                from torch.profiler import ProfilerActivity, profile

                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
                for mode in args.modes:
                    if mode == "single":  # one profiler window per seed's run: profile one seed
                        seeds = args.seeds[:1]
                    else:
                        seeds = args.seeds
                    prof = profile(activities=acts)
                    with training_only(prof):
                        stage(args.ladder, base, mode, args.torch_profile, seeds, args.device,
                              args.out / f"{mode}-prof")
                    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
                    print(f"\ntorch.profiler, {mode}, {args.torch_profile} steps of seeds {seeds} (training only), "
                          f"by {key}:")
                    print(prof.key_averages().table(sort_by=key, row_limit=22, max_name_column_width=48))
                    if cuda:
                        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12,
                                                        max_name_column_width=48))
    finally:
        warnings.showwarning = old_show
    print("\nwarnings during the runs (count, text):")
    for w, c in seen.most_common():
        print(f"  {c:5d}  {w[:400]}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step_profile.json").write_text(json.dumps({"results": results, "warnings": dict(seen)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
