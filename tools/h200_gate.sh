#!/usr/bin/env bash
# Run on the lent H200 (device tool): install carried wheels, install the package, run the GPU
# tests and the full qwen3-8b gate, and leave everything under $OUT.
# Usage: bash tools/h200_gate.sh [extra rl-engine gate args]
# Environment: SKIP_TESTS=1, TEST_ARGS (pytest arguments), BENCH_ARGS (a bench run first), GATE_TIMEOUT.
set -uo pipefail
# The caller passes RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY (they win over any git directory in the copy).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. tools/device_setup.sh "$OUT"
rl-engine env --json >"$OUT/env.json"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >>"$OUT/env.json.txt" 2>&1
if [ "${SKIP_TESTS:-0}" != "1" ]; then
  # TEST_ARGS picks tests (default: every test marked gpu); one process (no xdist: one GPU, and
  # the device installs no test plugins)
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -o addopts=-ra ${TEST_ARGS:--x -m gpu tests} 2>&1 | tail -n 60 >"$OUT/gpu-tests.log"
  tail -n 5 "$OUT/gpu-tests.log"
fi
if [ -n "${BENCH_ARGS:-}" ]; then
  # BENCH_ARGS: an `rl-engine bench` run before the gate, same call (e.g. the chain rows after a
  # kernel change); packed as bench.tgz
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-120}" rl-engine bench $BENCH_ARGS --out "$OUT/bench" >"$OUT/bench-stdout.txt" 2>"$OUT/bench-progress.log"
  echo "bench rc $?"; grep -v Warn "$OUT/bench-progress.log" | tail -n 12
  mv "$OUT/bench-stdout.txt" "$OUT/bench-progress.log" "$OUT/bench/" 2>/dev/null
  tar czf "$OUT/bench.tgz" -C "$OUT" bench && rm -rf "$OUT/bench"
fi
# GATE_TIMEOUT leaves time to pack a partial run (finish it later with --resume)
# default: what is left of a 590 s device call after the tests and the bench, less 20 s to pack
timeout "${GATE_TIMEOUT:-$(( 570 - SECONDS > 30 ? 570 - SECONDS : 30 ))}" rl-engine gate --out "$OUT/gate" "$@" 2>"$OUT/gate-progress.log"
rc=$?
tail -n 30 "$OUT/gate-progress.log"
echo "gate exit code $rc"
# the device tool returns at most 8 files: pack the gate folder (evidence, reports, plots) and the
# call's small files into one archive, so that a round run after it in the same call (OUT=$OUT/round)
# still has room for its own archives
mkdir -p "$OUT/gate"
for f in env.json env.json.txt gate-progress.log install.log gpu-tests.log; do
  [ -f "$OUT/$f" ] && mv "$OUT/$f" "$OUT/gate/"
done
tar czf "$OUT/gate.tgz" -C "$OUT" gate && rm -rf "$OUT/gate"
exit 0
