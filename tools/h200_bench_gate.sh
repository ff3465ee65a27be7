#!/usr/bin/env bash
# Run on the lent H200 (device tool): the decode bench, then as much of the full gate as the call
# leaves time for. The gate is finished (reports, the rest of the cells) and the GPU tests run by
# tools/h200_gate_resume.sh in a second call, started at once so the machine is still warm.
# env: OUT, CALL_LIMIT (the call's timeout_s, default 590), BENCH_OPS (default chain_decode),
#      RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY (literal, as for every device script).
# Leaves $OUT/bench.tgz (bench folder and logs) and $OUT/gate.tgz (tools/h200_gate.sh's archive).
set -uo pipefail
OUT=${OUT:-/tmp/out}
start=$(date +%s)
mkdir -p "$OUT/b"
. tools/device_setup.sh "$OUT/b"
# shellcheck disable=SC2086
timeout 150 rl-engine bench --ops ${BENCH_OPS:-chain_decode} --out "$OUT/bench" >"$OUT/b/bench-stdout.txt" \
  2>"$OUT/b/bench-progress.log"
echo "bench rc $? after $(( $(date +%s) - start )) s"
grep -v "Warn\|rotary\|crop" "$OUT/b/bench-progress.log" | grep "graph\|missed\|targets" | tail -n 12
(cd "$OUT" && tar czf bench.tgz bench b && rm -rf bench b)
left=$(( ${CALL_LIMIT:-590} - ($(date +%s) - start) - 40 ))  # time to pack the gate folder
echo "gate for at most $left s"
SKIP_TESTS=1 GATE_TIMEOUT=$left bash tools/h200_gate.sh
