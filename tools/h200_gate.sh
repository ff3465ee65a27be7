#!/usr/bin/env bash
# Run on the lent H200 (device tool): install carried wheels, install the package, run the GPU
# tests and the full qwen3-8b gate, and leave everything under $OUT.
# Usage: bash tools/h200_gate.sh [extra rl-engine gate args]
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
# GATE_TIMEOUT leaves time to pack a partial run (finish it later with --resume)
timeout "${GATE_TIMEOUT:-570}" rl-engine gate --out "$OUT/gate" "$@" 2>"$OUT/gate-progress.log"
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
