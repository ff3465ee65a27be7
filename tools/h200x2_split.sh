#!/usr/bin/env bash
# Run on the lent two-GPU H200 machine (device tool, kind nvidia-h200-x2): per kernel backend, one
# op gate and one chain gate on that backend's own GPU, all at the same time, beside the TP=2
# checks on both GPUs (and optionally the test suite). The device tool returns at most 8 files, so
# every output folder is packed into $OUT/results.tgz at the end (evidence.json, reports, logs).
# A gate stopped by its timeout leaves a partial evidence.json: finish it with `rl-engine gate --resume`.
# Usage: bash tools/h200x2_split.sh [extra rl-engine gate args for the op gates]
#   GATE_TIMEOUT=480 TEST_TIMEOUT=420 TP_TIMEOUT=420   seconds before each part is stopped
#   TESTS=1 / TP=0 / CHAIN=0                           add the tests, leave TP or the chain out
set -uo pipefail
# The caller passes RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY (they win over any git directory in the copy).
OUT=${OUT:-/tmp/out}
R="$OUT/results"
mkdir -p "$R/tp"
. tools/device_setup.sh "$R"
rl-engine env --json >"$R/env.json"
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; nvidia-smi topo -m; } \
  >"$R/gpus.txt" 2>&1
judg="forward_accuracy gradient_accuracy forward_invariance gradient_invariance repeat"
gpu=0
for b in triton_cuda_bf16 cuda_bf16; do
  CUDA_VISIBLE_DEVICES=$gpu timeout "${GATE_TIMEOUT:-480}" rl-engine gate --backend "$b" --workload qwen3-8b \
    --judgments $judg --out "$R/gate-$b" "$@" >"$R/gate-$b.stdout" 2>"$R/gate-$b.log" &
  if [ "${CHAIN:-1}" = "1" ]; then
    CUDA_VISIBLE_DEVICES=$gpu timeout "${GATE_TIMEOUT:-480}" rl-engine gate --backend "$b" --workload qwen3-8b \
      --judgments chain_parity --out "$R/chain-$b" >"$R/chain-$b.stdout" 2>"$R/chain-$b.log" &
  fi
  gpu=$((gpu + 1))
done
if [ "${TESTS:-0}" = "1" ]; then
  timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -v -p no:cacheprovider -n 8 tests >"$R/tests.log" 2>&1 &
fi
if [ "${TP:-1}" = "1" ]; then
  timeout "${TP_TIMEOUT:-420}" python3 -m rl_engine.tp.run --world-size 2 --backend nccl --out "$R/tp" \
    --kernel-backends triton_cuda_bf16,cuda_bf16 --chain-control >"$R/tp/run.log" 2>&1 &
fi
wait
{
  for f in "$R"/gate-*.log "$R"/chain-*.log; do echo "== $f"; grep -v "] green\|] n/a" "$f" | tail -n 12; tail -n 2 "$f"; done
  [ -f "$R/tests.log" ] && { echo "== tests"; grep -E "FAILED|ERROR" "$R/tests.log" | head -n 30; tail -n 3 "$R/tests.log"; }
  [ -f "$R/tp/run.log" ] && { echo "== tp"; tail -n 12 "$R/tp/run.log"; }
} | tee "$OUT/summary.txt"
tar czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$R"
ls -la "$OUT"
exit 0
