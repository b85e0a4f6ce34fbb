#!/usr/bin/env bash
# The screen of a late-harm attempt on one spent seed (bench/late_harm_notes.md, issue 23): build the ladder, split
# its held-out bpb by kind, train the truth on the screened checkpoints, score the capability families, then judge
# (a)-(d) with bench/late_harm_screen.py. From the repository root, with the package importable:
#   bash bench/late_harm_screen.sh OUT_PREFIX CURRICULUM SEED FINAL_START STEP [STEP ...]
# e.g. bash bench/late_harm_screen.sh /tmp/s22b-158 bench/late_harm_attempt22b.yaml 158 2800 \
#        2000 2200 2400 2600 2800 3000 3200
# Writes OUT_PREFIX/ (the ladder), OUT_PREFIX-bykind.csv, OUT_PREFIX-truth/, OUT_PREFIX-cap/ and
# OUT_PREFIX-screen.json; a ladder already written (its last checkpoint present) is reused. One thread per process.
set -euo pipefail
if [ $# -lt 5 ]; then
  echo "usage: bash bench/late_harm_screen.sh OUT_PREFIX CURRICULUM SEED FINAL_START STEP [STEP ...]" >&2; exit 2
fi
D=$1; CUR=$2; S=$3; FINAL=$4; shift 4; CK=("$@")
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
LAST=${CK[${#CK[@]}-1]}
STEPS=$($PY -c "import sys; from probeselect.toy.curriculum import load_curriculum as c; print(c(sys.argv[1]).steps)" \
  "$CUR")
[ -f "$D/checkpoint-$LAST/config.json" ] || $PY -m probeselect toy-ladder "$D" --seed "$S" --curriculum "$CUR" \
  --steps "$STEPS" --tokenizer-corpus reference --threads 1 --no-progress
$PY bench/heldout_by_kind.py "$D" --checkpoints "${CK[@]}" --out "$D-bykind.csv"
mkdir -p "$D-cap-ck"
for c in "${CK[@]}"; do ln -sfn "$(cd "$D" && pwd)/checkpoint-$c" "$D-cap-ck/checkpoint-$c"; done
$PY -m probeselect score "$D-cap-ck" --probes probes/capability/arith_plain.yaml probes/capability/relation_plain.yaml \
  --seeds 0 1 --out "$D-cap" --device cpu --no-progress
$PY bench/late_harm_truth.py "$D" --checkpoints "${CK[@]}" --truth-seeds 6 --out "$D-truth"
$PY bench/late_harm_screen.py --truth "$D-truth" --bykind "$D-bykind.csv" --scores "$D-cap/scores.parquet" \
  --final-start "$FINAL" --json "$D-screen.json"
