#!/usr/bin/env bash
# Run on the lent two-GPU H200 machine (device tool, kind nvidia-h200-x2): one gate per kernel
# backend, each on its own GPU and at the same time, beside the test suite on the GPU and the TP=2
# checks. Everything lands under $OUT: gate-<backend>/ (evidence.json, reports), tests.log, tp/.
# A gate stopped by its timeout leaves a partial evidence.json: finish it with `rl-engine gate --resume`.
# Usage: bash tools/h200x2_split.sh [extra rl-engine gate args]
#   GATE_TIMEOUT=500 TEST_TIMEOUT=420 TP_TIMEOUT=420   seconds before each part is stopped
#   TESTS=0 / TP=0                                     leave that part out
set -uo pipefail
# The caller passes RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY: the copied tree has no git history.
export PYTHONUNBUFFERED=1 CI=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/tp"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 2
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 2; }
rl-engine env --json >"$OUT/env.json"
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; nvidia-smi topo -m; } \
  >"$OUT/gpus.txt" 2>&1
gpu=0
for b in triton_cuda_bf16 cuda_bf16; do
  CUDA_VISIBLE_DEVICES=$gpu timeout "${GATE_TIMEOUT:-500}" rl-engine gate --backend "$b" --workload qwen3-8b \
    --out "$OUT/gate-$b" "$@" >"$OUT/gate-$b.stdout" 2>"$OUT/gate-$b.log" &
  gpu=$((gpu + 1))
done
if [ "${TESTS:-1}" = "1" ]; then
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -v -p no:cacheprovider -n 8 tests >"$OUT/tests.log" 2>&1 &
fi
if [ "${TP:-1}" = "1" ]; then
  timeout "${TP_TIMEOUT:-420}" python3 -m rl_engine.tp.run --world-size 2 --backend nccl --out "$OUT/tp" \
    --kernel-backends triton_cuda_bf16,cuda_bf16 --chain-control >"$OUT/tp/run.log" 2>&1 &
fi
wait
for b in triton_cuda_bf16 cuda_bf16; do echo "== gate $b"; tail -n 8 "$OUT/gate-$b.log"; tail -n 3 "$OUT/gate-$b.stdout"; done
[ -f "$OUT/tests.log" ] && { echo "== tests"; grep -E "FAILED|ERROR" "$OUT/tests.log" | head -n 30; tail -n 3 "$OUT/tests.log"; }
[ -f "$OUT/tp/run.log" ] && { echo "== tp"; tail -n 15 "$OUT/tp/run.log"; }
exit 0
