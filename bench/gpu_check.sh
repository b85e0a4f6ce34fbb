#!/usr/bin/env bash
# One prepared GPU check (issue 26), run from the repository root on a machine with one CUDA GPU.
#
#   bash bench/gpu_check.sh            # writes its logs to $OUT (default /tmp/gpu-check)
#
# Needs: python3 with torch (CUDA), transformers, peft, accelerate, pandas, pyarrow, pytest; datasets
# and trl for the TRL side (wheels in .whl/ are installed into /tmp/site first where present); a demo
# ladder in results/demo/ladder (`make demo` builds it) for parts D-G. Parts B and C have fixed
# time limits (150 s, 170 s); D-G get what is left of BUDGET seconds (560) and are skipped when too
# little is left, so one slow part cannot take all the others' time.
#   A  versions and the GPU
#   B  tests/test_sft_batched.py on the GPU (PROBESELECT_TEST_DEVICE=cuda): batched seeds equal the
#      single-run path per seed, per-run clipping, nonfinite in one run, SIGKILL + resume, packing
#      isolation; -s prints the max relative difference per quantity
#   C  bench/sft.py --device cuda --size 58m --seeds 3: the 3-seed matched pilot vs 3 sequential TRL runs
#   D  bench/batched_seeds.py --device cuda: the demo's pilot stage, one seed at a time vs batched
#   E  the whole demo pipeline on the GPU from the carried ladder (probeselect run ... device=cuda), in
#      /tmp/gpu-demo (this checkout's results/demo is only read)
#   F  bench/step_profile.py --device cuda: where a batched step's time goes vs a single run's (timed
#      parts, torch.profiler over training only), two runs of each compared bitwise, the warnings
#      (an op without a deterministic CUDA kernel names itself)
#   G  the demo's pilot and confirmation stages on the GPU with jobs=3 (3 worker processes sharing it) vs
#      the batched default (jobs=1, pilot only) vs one seed and one base at a time; jobs3 vs packed compared
#      bitwise (train logs without clock fields, adapter tensors, transfer.csv)
# PARTS selects parts (default "A B C D E"; e.g. PARTS="A F" bash bench/gpu_check.sh); B_TESTS narrows
# part B to a pytest -k expression.
set -u
PARTS=" ${PARTS:-A B C D E} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: part E writes into it from another folder
BUDGET=${BUDGET:-560}
t0=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - t0) )); }
part() { echo "=== $1 (t=$(( $(date +%s) - t0 )) s, $(left) s left)"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# what the CLI sets at start (cli.main); the tests below call the library directly
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}

if want A; then
part A | tee "$OUT/env.txt"
python3 - <<'EOF' 2>&1 | tee -a "$OUT/env.txt"
import importlib, torch
for m in ("torch", "transformers", "peft", "accelerate", "datasets", "trl", "pandas", "pyarrow"):
    try:
        mod = importlib.import_module(m)
        print(m, mod.__version__, mod.__file__)
    except Exception as exc:  # noqa: BLE001 - a report, not a program
        print(m, "NOT IMPORTABLE:", type(exc).__name__, exc)
print("cuda", torch.cuda.is_available(), torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else "")
print("tf32 matmul", torch.backends.cuda.matmul.allow_tf32, "cudnn tf32", torch.backends.cudnn.allow_tf32)
EOF
nvidia-smi -L 2>&1 | tee -a "$OUT/env.txt"
fi

if want B; then
part B | tee "$OUT/eq.log"
PROBESELECT_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/test_sft_batched.py \
  ${B_TESTS:+-k "$B_TESTS"} 2>&1 | tee -a "$OUT/eq.log"
fi

if want C; then
part C | tee "$OUT/sft58.log"
timeout 170 python3 bench/sft.py --device cuda --size 58m --seeds 3 --steps 40 --warmup 5 2>&1 | tee -a "$OUT/sft58.log"
fi

if want D; then
part D | tee "$OUT/batched.log"
fi
if want D && [ -d results/demo/ladder ]; then
  for v in single packed; do  # one call each, so that a slow first variant cannot take the second's time
    t=$(( $(left) > 300 ? 120 : $(left) / 3 ))
    [ "$t" -ge 20 ] || { echo "part D $v: skipped, $(left) s left"; continue; }
    timeout "$t" python3 bench/batched_seeds.py results/demo/ladder --device cuda \
      --stages pilot --variants $v --rounds 1 --pilot-steps 150 --out /tmp/bench-batched 2>&1 \
      | awk '!seen[$0]++' | tee -a "$OUT/batched.log"
  done
fi

if want E; then
part E | tee "$OUT/demo.log"
fi
# in a scratch folder: results/demo/ladder and run_state.json copied from a CPU `make demo`, so the ladder
# stage is skipped (its files are unchanged) and every later stage reruns on the GPU; the demo folder of
# this checkout is left as it is
if want E && [ -f results/demo/run_state.json ] && [ "$(left)" -gt 30 ]; then
  repo=$PWD
  rm -rf /tmp/gpu-demo && mkdir -p /tmp/gpu-demo/results/demo
  cp -r results/demo/ladder results/demo/run_state.json /tmp/gpu-demo/results/demo/
  ln -s "$repo/probes" /tmp/gpu-demo/probes && ln -s "$repo/recipes" /tmp/gpu-demo/recipes
  s=$(date +%s)
  (cd /tmp/gpu-demo && timeout $(( $(left) - 10 )) python3 -m probeselect run --no-progress recipes/demo.yaml \
     out=results/demo device=cuda 2>&1) | awk '!seen[$0]++' | tee -a "$OUT/demo.log"
  echo "demo on GPU: rc=${PIPESTATUS[0]} in $(( $(date +%s) - s )) s" | tee -a "$OUT/demo.log"
  (cd /tmp/gpu-demo/results/demo/score 2>/dev/null && tar czf "$OUT/demo-gpu.tgz" report.md summary.csv shortlist.csv \
     selection.csv selection.json confirm.json pilot/transfer.csv pilot/diagnostics.csv confirm/transfer.csv \
     manifest.json 2>/dev/null)
fi
if want F && [ -d results/demo/ladder ]; then
  part F | tee "$OUT/step_profile.log"
  rm -rf /tmp/step-profile  # never a result left by an earlier call on a still-warm machine
  t=$(( $(left) - 5 ))
  if [ "$t" -ge 30 ]; then
    timeout "$t" python3 bench/step_profile.py results/demo/ladder --device cuda --steps 100 \
      --modes packed single --repeat 2 --torch-profile 20 --out /tmp/step-profile 2>&1 | grep -v '^USDT' \
      | tee -a "$OUT/step_profile.log"
    cp /tmp/step-profile/step_profile.json "$OUT/" 2>/dev/null
  else
    echo "part F: skipped, $(left) s left" | tee -a "$OUT/step_profile.log"
  fi
fi
if want G && [ -d results/demo/ladder ]; then
  part G | tee "$OUT/jobs.log"
  rm -rf /tmp/bench-jobs  # never compare against a folder left by an earlier call
  for spec in "pilot jobs3" "pilot packed" "pilot single" "confirm jobs3" "confirm single"; do
    set -- $spec
    t=$(( $(left) - 10 ))
    [ "$t" -ge 30 ] || { echo "part G $spec: skipped, $(left) s left" | tee -a "$OUT/jobs.log"; continue; }
    timeout "$t" python3 bench/batched_seeds.py results/demo/ladder --device cuda --stages "$1" --variants "$2" \
      --rounds 1 --out /tmp/bench-jobs 2>&1 | grep -v '^USDT' | awk '!seen[$0]++' | tee -a "$OUT/jobs.log"
  done
  python3 - <<'EOF' 2>&1 | tee -a "$OUT/jobs.log"
import filecmp, sys
from pathlib import Path
sys.path.insert(0, "bench")
from step_profile import compare_runs
a, b = Path("/tmp/bench-jobs/r0-pilot.yaml-packed"), Path("/tmp/bench-jobs/r0-pilot.yaml-jobs3")
if a.is_dir() and b.is_dir():
    diffs, n_rows, n_tensors = compare_runs(a, b)
    same_csv = filecmp.cmp(a / "transfer.csv", b / "transfer.csv", shallow=False)
    print(f"pilot jobs3 vs jobs1 (packed): {n_rows} log rows, {n_tensors} state tensors, "
          f"{len(diffs)} differences; transfer.csv identical: {same_csv}")
    for d in diffs[:10]:
        print("  ", d)
else:
    print(f"pilot jobs3 vs jobs1: not compared ({a.name if not a.is_dir() else b.name} missing)")
EOF
fi
part end
