#!/bin/bash
# Issue 51 step 2 (first part): why LRC-BERT's gradient perturbation stalls a pretrained student.
# The teacher (MiniLM fine-tuned 60 steps on SST-2's first 512 rows), then the student runs
# through instrument.py (per-step records of the perturbation); summarise.py prints the windows.
#   bash benchmarks/lrc_perturbation/run.sh OUT      (from the repository root; ~1 CPU h on AVX2)
set -euo pipefail
OUT=${1:?usage: run.sh OUT}
GLUE=../shared/data/glue
MINILM=../shared/data/text-models/all-MiniLM-L6-v2
export PYTHONPATH=$PWD OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
PY=.venv/bin/python
HERE=benchmarks/lrc_perturbation
mkdir -p "$OUT"
$PY recipes/bert_finetune.py --task sst2 --glue-dir $GLUE --train-rows 512 --model hf:$MINILM \
  --steps 60 --lr 1e-4 --progress false --output-dir "$OUT/teacher" > "$OUT/teacher.log" 2>&1
COMMON="--teacher $OUT/teacher/model --task sst2 --glue-dir $GLUE --train-rows 512 --student hf:$MINILM
  --keep-layers 1,2,4,5 --steps 160 --batch-size 16 --progress false --log-every 8
  --save-every-epochs 0 --save-every-steps 0"
run() { name=$1; scope=$2; shift 2
  $PY $HERE/instrument.py "$OUT/$name.jsonl" "$scope" -- $COMMON "$@" --output-dir "$OUT/$name" > "$OUT/$name.log" 2>&1; }
run lrc-sample sample --lr 1e-4
run lrc-sample-s1 sample --lr 1e-4 --seed 1
run lrc-batch batch --lr 1e-4
run lrc-sample-lr3e-4 sample --lr 3e-4
$PY recipes/lrc_bert.py $COMMON --lr 1e-4 --perturb false --output-dir "$OUT/lrc-noperturb" > "$OUT/lrc-noperturb.log" 2>&1
$PY $HERE/summarise.py "$OUT"/lrc-*.jsonl
