#!/usr/bin/env bash
# Issue #36 on the H200 (one call, about 5 minutes warm): the first-generate probe of the capture
# procedure before the fix (PROBE_VARIANTS, default legacy-capture; PROBE_PRESETS, default tiny,qwen3-8b),
# then the rollout GPU tests on both backends (TEST_ARGS, default tests/rollout), then
# `rl-engine generate --json` in a fresh process per backend (its first call a graph generate).
# Everything lands in $OUT/robustness.tgz (the only file it leaves).
set -u
R=$OUT/robustness
. tools/device_setup.sh "$R"
cat "$R/env.txt"
OUT=$R python3 tools/first_generate_probe.py --variants "${PROBE_VARIANTS:-legacy-capture}" \
  --presets "${PROBE_PRESETS:-tiny,qwen3-8b}" --repeat "${PROBE_REPEAT:-1}" 2>&1 | tee "$R/probe.txt"
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -rs -n "${TEST_PROCS:-2}" ${TEST_ARGS:-tests/rollout} 2>&1 \
  | tee "$R/gpu-tests.log" | tail -15
for b in triton_cuda_bf16 cuda_bf16; do
  timeout 200 rl-engine generate --model tiny --backend "$b" --prompts '1,2,3;4,5' --max-new-tokens 8 --json \
    > "$R/generate-$b.json" 2> "$R/generate-$b.err"; echo "generate $b rc=$?"
done
cd "$OUT" && tar czf robustness.tgz robustness && rm -rf robustness
