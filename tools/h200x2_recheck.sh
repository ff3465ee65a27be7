#!/usr/bin/env bash
# Run on the lent two-GPU H200 machine (device tool, kind nvidia-h200-x2) after a kernel change to
# a few ops: GPU 0 re-judges those ops (every judgment, qwen3-8b) and then benchmarks them; GPU 1
# runs the plugin backends' gates and the given test files. Results are packed into
# $OUT/results.tgz (the device tool returns at most 8 files).
# Usage: OPS="linear_logp" BENCH_OPS="linear_logp" PLUGINS="liger,hf_transformers" \
#        TESTS="tests/test_gate.py" bash tools/h200x2_recheck.sh
#   BACKENDS=triton_cuda_bf16   backends re-judged and benchmarked on GPU 0
#   PART_TIMEOUT=200            seconds before each part is stopped
set -uo pipefail
# The caller passes RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY (see tools/README.md).
OUT=${OUT:-/tmp/out}
R="$OUT/results"
T=${PART_TIMEOUT:-200}
B=${BACKENDS:-triton_cuda_bf16}
mkdir -p "$R"
. tools/device_setup.sh "$R"
rl-engine env --json >"$R/env.json"
(
  export CUDA_VISIBLE_DEVICES=0
  [ -n "${OPS:-}" ] && timeout "$T" rl-engine gate --backend "$B" --workload qwen3-8b --ops $OPS \
    --out "$R/gate-ops" >/dev/null 2>"$R/gate-ops.log"
  [ -n "${BENCH_OPS:-}" ] && timeout "$T" rl-engine bench --backend "$B" --ops $BENCH_OPS \
    --out "$R/bench" --time-budget $((T - 30)) >"$R/bench.stdout" 2>"$R/bench.log"
) &
(
  export CUDA_VISIBLE_DEVICES=1
  for p in $(echo "${PLUGINS:-}" | tr ',' ' '); do
    timeout "$T" rl-engine gate --backend "$p" --workload qwen3-8b --out "$R/gate-$p" >/dev/null 2>"$R/gate-$p.log"
  done
  [ -n "${TESTS:-}" ] && timeout "$T" python3 -m pytest -q -p no:cacheprovider $TESTS >"$R/tests.log" 2>&1
) &
wait
{
  for f in "$R"/gate-*.log; do echo "== $f"; grep -v "] green\|] n/a" "$f" | tail -n 15; tail -n 1 "$f"; done
  [ -f "$R/bench.stdout" ] && { echo "== bench"; tail -n 20 "$R/bench.stdout"; }
  [ -f "$R/tests.log" ] && { echo "== tests"; tail -n 15 "$R/tests.log"; }
} | tee "$OUT/summary.txt"
tar czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$R"
exit 0
