#!/usr/bin/env bash
# One prepared GPU check (issue 26), run from the repository root on a machine with one CUDA GPU.
#
#   bash bench/gpu_check.sh            # writes its logs to $OUT (default /tmp/gpu-check)
#
# Needs: python3 with torch (CUDA), transformers, peft, accelerate, pandas, pyarrow, pytest; datasets
# and trl for the TRL side (wheels in .whl/ are installed into /tmp/site first where present); a demo
# ladder in results/demo/ladder (`make demo` builds it) for parts D and E. Parts B and C have fixed
# time limits (150 s, 170 s); D and E get what is left of BUDGET seconds (560) and are skipped when too
# little is left, so one slow part cannot take all the others' time.
#   A  versions and the GPU
#   B  tests/test_sft_batched.py on the GPU (PROBESELECT_TEST_DEVICE=cuda): batched seeds equal the
#      single-run path per seed, per-run clipping, nonfinite in one run, SIGKILL + resume, packing
#      isolation; -s prints the max relative difference per quantity
#   C  bench/sft.py --device cuda --size 58m --seeds 3: the 3-seed matched pilot vs 3 sequential TRL runs
#   D  bench/batched_seeds.py --device cuda: the demo's pilot stage, one seed at a time vs batched
#   E  the whole demo pipeline on the GPU from the carried ladder (probeselect run ... device=cuda), in
#      /tmp/gpu-demo (this checkout's results/demo is only read)
set -u
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

part B | tee "$OUT/eq.log"
PROBESELECT_TEST_DEVICE=cuda timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/test_sft_batched.py \
  2>&1 | tee -a "$OUT/eq.log"

part C | tee "$OUT/sft58.log"
timeout 170 python3 bench/sft.py --device cuda --size 58m --seeds 3 --steps 40 --warmup 5 2>&1 | tee -a "$OUT/sft58.log"

part D | tee "$OUT/batched.log"
if [ -d results/demo/ladder ]; then
  for v in single packed; do  # one call each, so that a slow first variant cannot take the second's time
    t=$(( $(left) > 300 ? 120 : $(left) / 3 ))
    [ "$t" -ge 20 ] || { echo "part D $v: skipped, $(left) s left"; continue; }
    timeout "$t" python3 bench/batched_seeds.py results/demo/ladder --device cuda \
      --stages pilot --variants $v --rounds 1 --pilot-steps 150 --out /tmp/bench-batched 2>&1 \
      | awk '!seen[$0]++' | tee -a "$OUT/batched.log"
  done
fi

part E | tee "$OUT/demo.log"
# in a scratch folder: results/demo/ladder and run_state.json copied from a CPU `make demo`, so the ladder
# stage is skipped (its files are unchanged) and every later stage reruns on the GPU; the demo folder of
# this checkout is left as it is
if [ -f results/demo/run_state.json ] && [ "$(left)" -gt 30 ]; then
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
part end
