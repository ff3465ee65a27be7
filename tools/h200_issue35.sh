#!/usr/bin/env bash
# Issue #35 on the H200 (one call): the patched Hugging Face model against the engine's sampled
# logprobs at Qwen3-8B shapes (tools/hf_rollout_parity.py: 3 seeds x 2 backends, 8 prompts x
# HF_TOKENS completion tokens), then RL_STEPS GRPO steps at RL_MODEL shapes with the project's
# kernels and the torch_bf16 control (rl-engine rl-step), then the GPU run of TEST_ARGS.
# Everything lands in $OUT/issue35.tgz (the only file it leaves).
set -u
R=$OUT/issue35
. tools/device_setup.sh "$R"
cat "$R/env.txt"
timeout "${HF_TIMEOUT:-240}" python3 tools/hf_rollout_parity.py --preset qwen3-8b --seeds 0 1 2 --prompts 8 \
  --max-new-tokens "${HF_TOKENS:-128}" --out "$R/hf" 2>&1 | tee "$R/hf.log" | tail -8
timeout "${RL_TIMEOUT:-200}" rl-engine rl-step ${RL_ARGS:---model qwen3-8b --steps 3 --prompts 4 --group 4 --max-new-tokens 32} \
  --out "$R/rl" 2>&1 | tee "$R/rl.log" | tail -20
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -rs -n "${TEST_PROCS:-2}" ${TEST_ARGS:-tests/integrations tests/rl tests/rollout/test_rollout_sampling.py} 2>&1 \
  | tee "$R/gpu-tests.log" | tail -15
cd "$OUT" && tar czf issue35.tgz issue35 && rm -rf issue35
