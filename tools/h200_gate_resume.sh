#!/usr/bin/env bash
# Run on the lent H200 (device tool), after tools/h200_bench_gate.sh or h200_gate.sh stopped at
# its timeout: finish the gate in DIR (the returned gate.tgz unpacked into the tree, e.g. under
# evidence/<date>-h200-gate-<sha>/) with `rl-engine gate --resume DIR`, then the GPU tests
# (TEST_ARGS, default the decode kernels' and the engine's: about 40-110 s).
# Usage: bash tools/h200_gate_resume.sh DIR. Leaves $OUT/resume.tgz: DIR (evidence.json, report.md,
# plots/; report.html dropped, `rl-engine report DIR` writes it) and the call's logs.
set -uo pipefail
DIR=${1:?usage: h200_gate_resume.sh DIR}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/r"
. tools/device_setup.sh "$OUT/r"
timeout "${RESUME_TIMEOUT:-300}" rl-engine gate --resume "$DIR" >"$OUT/r/resume-stdout.txt" 2>"$OUT/r/resume-progress.log"
echo "gate rc $?"; tail -n 3 "$OUT/r/resume-progress.log"
# shellcheck disable=SC2086
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -o addopts=-ra \
  ${TEST_ARGS:--m gpu tests/ops/test_cuda_backend.py tests/chain/test_fused.py tests/rollout/test_rollout_graph_gpu.py} \
  >"$OUT/r/gpu-tests.log" 2>&1
echo "tests rc $?"; tail -n 3 "$OUT/r/gpu-tests.log"
rm -f "$DIR/report.html"
mkdir -p "$OUT/r/gate" && cp -r "$DIR"/. "$OUT/r/gate/"
(cd "$OUT" && tar czf resume.tgz r && rm -rf r)
exit 0
