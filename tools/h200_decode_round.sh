#!/usr/bin/env bash
# Run on the lent H200 (device tool): one round of decode work for issue #19 in one call:
# the GPU tests of the decode kernels, the decode-attention and det_gemm (M = 64) sweeps, and
# decode-step profiles; everything lands under $OUT.
# env: OUT, TESTS (pytest selection), PROFILES ("backend:batch:context ..."), ATTN_SWEEP=0 / GEMM_SWEEP=0
#      to skip a sweep, ATTN_BACKENDS ("triton cuda": the attention sweep per backend; ATTN_ARGS, e.g. --quick), GEMM_MS (the det_gemm
#      sweep's M values, default 64),
#      WARP_GEMV=1 / CUDA_FUSED=1 turn on the cuda_bf16 warp GEMV / fused launches for the call,
#      PDL=N sets the cuda_bf16 decode forward's PDL mode (rl_engine/chain/fused.py CUDA_DECODE_PDL) for the call,
#      FUSED_DRAW=1 to run the fused draw's GPU test (the draw is ON for the rest of the call only if it
#      passed), PACKED=1 / BUCKETS=1 to turn the engine's packed projections / per-bucket graphs on
#      for the call (before TESTS), FUSED=1 / LEAF_MERGE=1 the engine's fused launches / det_gemm's
#      in-leaf merge,
#      GEMV=1 for tools/gemv_compare.py (GEMV_ARGS, e.g. --variants; GEMV_TIMEOUT, default 150 s; NCU=1 adds an ncu profile),
#      NCU_ATTN=B:CONTEXT for an ncu profile of the CUDA decode attention's two launches (NCU_ATTN_SKIP /
#      NCU_ATTN_COUNT, default 2 / 2; 1 / 1 for the one-pass form's single launch), RMS_SWEEP=1
#      for tools/rms_decode_sweep.py, BENCH_OPS="chain_decode ..." to run
#      `rl-engine bench --ops` last. A flag turned on here is committed only after the call passed.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. tools/device_setup.sh "$OUT"
start=$(date +%s)
if [ "${PACKED:-0}" = "1" ]; then  # the engine's packed q/k/v and gate/up products on CUDA, for this call
  sed -i 's/^PACKED_ON_CUDA = False/PACKED_ON_CUDA = True/' rl_engine/rollout/engine.py && echo "packed projections ON"
fi
if [ "${BUCKETS:-0}" = "1" ]; then  # one CUDA graph per batch-size bucket, for this call
  sed -i 's/^BUCKETS_ON_CUDA = False/BUCKETS_ON_CUDA = True/' rl_engine/rollout/engine.py && echo "batch-size buckets ON"
fi
if [ "${FUSED:-0}" = "1" ]; then  # residual add + norm and the K/V write in one launch each, for this call
  sed -i 's/^FUSED_ON_CUDA = False/FUSED_ON_CUDA = True/' rl_engine/rollout/engine.py && echo "fused launches ON"
fi
if [ "${LEAF_MERGE:-0}" = "1" ]; then  # det_gemm's leaf-parallel form merges in its last leaf, for this call
  sed -i 's/^MERGE_IN_LEAVES_ON_CUDA = False/MERGE_IN_LEAVES_ON_CUDA = True/' rl_engine/ops/det_gemm/triton.py \
    && echo "in-leaf merge ON"
fi
if [ "${WARP_GEMV:-0}" = "1" ]; then  # cuda_bf16: the warp-streamed GEMV for M <= 16, for this call
  sed -i 's/^WARP_GEMV_ON_CUDA = False/WARP_GEMV_ON_CUDA = True/' rl_engine/ops/det_gemm/cuda.py && echo "warp GEMV ON"
fi
if [ "${CUDA_FUSED:-0}" = "1" ]; then  # cuda_bf16: its fused add + norm and qk_norm + RoPE + cache write, for this call
  sed -i 's/^CUDA_FUSED_ON = False/CUDA_FUSED_ON = True/' rl_engine/chain/fused.py && echo "cuda_bf16 fused launches ON"
fi
if [ -n "${PDL:-}" ]; then  # cuda_bf16: the decode forward's PDL mode, for this call
  sed -i "s/^CUDA_DECODE_PDL = [0-9]/CUDA_DECODE_PDL = $PDL/" rl_engine/chain/fused.py && echo "decode PDL mode $PDL"
fi
if [ "${FUSED_DRAW:-0}" = "1" ]; then
  timeout 120 python3 -m pytest -q -o addopts=-ra tests/rollout/test_rollout_sampling.py -k one_kernel_draw >"$OUT/fused-draw-test.log" 2>&1
  rc=$?; tail -n 3 "$OUT/fused-draw-test.log"
  if [ "$rc" = "0" ] && grep -q passed "$OUT/fused-draw-test.log"; then
    sed -i 's/^FUSED_DRAW_ON_CUDA = False/FUSED_DRAW_ON_CUDA = True/' rl_engine/rollout/sampling.py
    echo "fused draw test passed: the draw is ON for the rest of this call"
  else
    sed -i 's/^FUSED_DRAW_ON_CUDA = True/FUSED_DRAW_ON_CUDA = False/' rl_engine/rollout/sampling.py
    echo "fused draw test rc $rc: the draw is OFF for this call"
  fi
fi
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -o addopts=-ra $TESTS >"$OUT/gpu-tests.log" 2>&1
  echo "tests rc $? after $(( $(date +%s) - start )) s"; tail -n 25 "$OUT/gpu-tests.log"
fi
if [ "${ATTN_SWEEP:-1}" = "1" ]; then
  for be in ${ATTN_BACKENDS:-triton}; do
    timeout 200 python3 tools/attention_decode_sweep.py --backend "$be" --json "$OUT/attention_decode_sweep_$be.json" \
      >"$OUT/attention-sweep-$be.txt" 2>&1
    echo "attention sweep $be rc $? after $(( $(date +%s) - start )) s"; grep -v "^  " "$OUT/attention-sweep-$be.txt" | tail -n 12
  done
fi
if [ "${GEMM_SWEEP:-1}" = "1" ]; then
  timeout 220 python3 tools/det_gemm_decode_sweep.py --ms "${GEMM_MS:-64}" --json "$OUT/det_gemm_sweep_m${GEMM_MS:-64}.json" >"$OUT/det-gemm-sweep-m${GEMM_MS:-64}.txt" 2>&1
  echo "det_gemm sweep rc $? after $(( $(date +%s) - start )) s"; grep -v "^  " "$OUT/det-gemm-sweep-m${GEMM_MS:-64}.txt" | tail -n 12
fi
if [ "${GEMV:-0}" = "1" ]; then  # decode GEMVs of both backends vs cuBLAS, and (NCU=1) an ncu profile of the CUDA one (NCU_SKIP: gemv launches skipped first, 6 = the gate/up product at M = 1)
  timeout "${GEMV_TIMEOUT:-150}" python3 tools/gemv_compare.py ${GEMV_ARGS:-} >"$OUT/gemv-compare.txt" 2>&1
  echo "gemv compare rc $? after $(( $(date +%s) - start )) s"; grep -v Warn "$OUT/gemv-compare.txt" | tail -n 16
  [ "${NCU:-0}" = "1" ] && timeout 120 ncu --kernel-name regex:gemv_ --launch-skip "${NCU_SKIP:-6}" --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
    python3 tools/gemv_compare.py --once >"$OUT/ncu-gemv.txt" 2>&1 && echo "ncu done after $(( $(date +%s) - start )) s"
fi
if [ -n "${NCU_ATTN:-}" ]; then  # e.g. NCU_ATTN=16:8192: ncu of the CUDA decode attention's two launches there
  timeout 150 ncu --kernel-name regex:attn_decode --launch-skip "${NCU_ATTN_SKIP:-2}" --launch-count "${NCU_ATTN_COUNT:-2}" --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section LaunchStats python3 tools/attention_decode_sweep.py --backend cuda --once "$NCU_ATTN" \
    >"$OUT/ncu-attention.txt" 2>&1
  echo "ncu attention rc $? after $(( $(date +%s) - start )) s"
fi
if [ "${RMS_SWEEP:-0}" = "1" ]; then  # the Triton norm's warps at decode row counts
  timeout 120 python3 tools/rms_decode_sweep.py --json "$OUT/rms_decode_sweep.json" >"$OUT/rms-sweep.txt" 2>&1
  echo "rms sweep rc $? after $(( $(date +%s) - start )) s"; grep -v Warn "$OUT/rms-sweep.txt" | tail -n 30
fi
for p in ${PROFILES:-}; do  # backend:batch:context[:PDL mode of the cuda_bf16 decode forward[:of its attention[:tile GEMV from M[:GEMV variant]]]]
  IFS=: read -r be b c pdl pdla tile gv <<<"$p"
  name="profile-$be-B$b-ctx$c${pdl:+-pdl$pdl}${pdla:+-attn$pdla}${tile:+-tile$tile}${gv:+-gv$gv}"
  timeout 120 python3 tools/decode_profile.py --backend "$be" --batch "$b" --context "$c" --top 14 ${pdl:+--pdl "$pdl"} \
    ${pdla:+--pdl-attention "$pdla"} ${tile:+--tile-gemv-min-m "$tile"} ${gv:+--gemv-variant "$gv"} >"$OUT/$name.txt" 2>&1
  echo "profile $p rc $? after $(( $(date +%s) - start )) s"; grep -v Warning "$OUT/$name.txt" | grep -v _warn_once | head -n 9
done
if [ -n "${BENCH_OPS:-}" ]; then  # e.g. "chain_decode" or "chain_decode chain_generate"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-300}" rl-engine bench --ops $BENCH_OPS --out "$OUT/bench" >"$OUT/bench-stdout.txt" 2>"$OUT/bench-progress.log"
  echo "bench rc $? after $(( $(date +%s) - start )) s"; tail -n 16 "$OUT/bench-progress.log"
  (cd "$OUT" && tar czf bench.tgz bench && rm -rf bench)
fi
# the device tool returns at most 8 files: everything goes into one archive, and only the
# archives are left under $OUT so that both come back
(cd "$OUT" && tar czf round.tgz --exclude=round.tgz --exclude=bench.tgz ./*.txt ./*.json ./*.log 2>/dev/null \
  && find . -maxdepth 1 -type f ! -name '*.tgz' -delete)
exit 0
