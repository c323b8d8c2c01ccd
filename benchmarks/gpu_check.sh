#!/usr/bin/env bash
# The GPU checks of one device lease, in one command (issue: "On a GPU"): the GPU tests, then
# benchmarks/bench_gpu.py within a time budget. Writes everything under $OUT (default
# /tmp/gpu_out): pytest.log, gpu_bench.jsonl, bench.log, the CIFAR metrics.
#   OUT=/tmp/gpu_out BENCH_BUDGET_S=380 bash benchmarks/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.
PY=${PY:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/env.txt"
$PY -c "import torch, torchvision, timm, accelerate; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'timm', timm.__version__, 'accelerate', accelerate.__version__)" | tee -a "$OUT/env.txt"
timeout "${TEST_TIMEOUT_S:-130}" $PY -m pytest -q -p no:cacheprovider -o addopts="" -ra \
    tests/gpu tests/augment/test_device_decode.py \
    tests/augment/test_pipelines.py::test_cuda_device_path_matches_the_cpu 2>&1 | tail -40 | tee "$OUT/pytest.log"
eval "$PY benchmarks/bench_gpu.py --out '$OUT' --budget-s ${BENCH_BUDGET_S:-380} \
    --run-timeout ${RUN_TIMEOUT_S:-150} ${BENCH_ARGS:-}" 2>&1 | tee "$OUT/bench.log" | grep -v '^\$'
