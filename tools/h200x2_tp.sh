#!/usr/bin/env bash
# Run on the lent two-GPU H200 machine (device tool, kind nvidia-h200-x2): install the carried
# wheels and the package, turn NVLink SHARP / multicast off, and run the real TP=2 checks over NCCL
# (det_gemm at the Qwen3-8B projection shapes with the BF16 all-reduce and the gather + tree merge,
# the FP32-merge negative control, the Qwen3-8B chain row-parallel teacher forcing vs the
# single-process rollout decode, and its FP32-merge control). Leaves $OUT/tp/tp.json and run.log.
# Usage: bash tools/h200x2_tp.sh [extra python -m rl_engine.tp.run args]
#   KERNEL_BACKENDS=triton_cuda_bf16,cuda_bf16   also check the CUDA C++ det_gemm (builds it first)
#   TP_TIMEOUT=540                               seconds before the run is stopped
set -uo pipefail
# The caller passes RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY (they win over any git directory in the copy).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/tp"
. tools/device_setup.sh "$OUT"
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; nvidia-smi topo -m; } \
  >"$OUT/tp/gpus.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.cuda.device_count(), torch.cuda.nccl.version())" >>"$OUT/tp/gpus.txt" 2>&1
timeout "${TP_TIMEOUT:-540}" python3 -m rl_engine.tp.run --world-size 2 --backend nccl --out "$OUT/tp" \
  --kernel-backends "${KERNEL_BACKENDS:-triton_cuda_bf16}" --chain-control "$@" >"$OUT/tp/run.log" 2>&1
rc=$?
tail -n 40 "$OUT/tp/run.log"
echo "tp exit code $rc"
exit "$rc"
