#!/usr/bin/env bash
# Issue #33 on the H200 (one call): the GPU tests of TEST_ARGS (det_gemm's forms, bit for bit),
# the persistent det_gemm sweep (tools/det_gemm_prefill_sweep.py, SWEEP_ARGS), and where a
# Qwen3-8B teacher-forcing call and train step spend their time (tools/train_step_profile.py,
# PROF_ARGS; PROF_OLD_ARGS, if set, runs a second profile, e.g. "--no-persistent --modes train_step"),
# then, if ATTN_ARGS is set, the attention sweep (tools/attention_prefill_sweep.py), if LOGP_ARGS is
# set, the linear_logp sweep (tools/linear_logp_sweep.py), if SWIGLU_ARGS is set, the fused gate / up +
# SwiGLU sweep (tools/gate_up_swiglu_sweep.py), if REDUCE_ARGS is set, the norm dweight stage-2 sweep
# (tools/rms_dw_reduce_sweep.py), if DECLARED_ATTN_ARGS is set, the declared attention forms' bits and
# time (tools/attention_declared_time.py), if BENCH_ARGS is set, `rl-engine bench $BENCH_ARGS`, and
# last (a diagnostic: the step a short call loses first), if NCU_KERNELS is set, one `ncu --set full`
# profile per kernel of that ';'-separated list of regular expressions over the names as ncu demangles
# them, template arguments written as casts: form 5's forward is
# "tree_wgmma_ws_kernel<.int.2, .bool.0, .bool.0, .bool.0, .bool.0, .bool.0, .bool.1, .bool.0, .bool.0>"
# (`.` for the parentheses of "(int)2" / "(bool)0"; written as in C++, "<2, false, ...>", it matched
# nothing and ncu said "No kernels were profiled" on 2026-12-06), e.g. "<that>;rms_bwd_dx_rows",
# each the launch after NCU_SKIP (default 2) matching ones in `tools/train_step_profile.py
# $NCU_PROF_ARGS --calls-only 1` (default: cuda_bf16, the train step at 4 x 1024 tokens), or in NCU_CMD
# when set (split at spaces), e.g. one product of the det_gemm sweep with NCU_SKIP=0: "python3
# tools/det_gemm_prefill_sweep.py --ms 8192 --shapes q_o --products forward --configs 128x128x8x3x8x3r
# --cuda-forms 5 --rep-ms 5 --out /tmp/ncu-sweep.json", where both backends' kernels run the same
# product (Triton's is named `_det_gemm_persistent_kernel`).
# SKIP_TESTS=1 / SKIP_SWEEP=1 / SKIP_PROF=1 skip a step. Everything lands in $OUT/issue33.tgz (the only
# file it leaves).
set -u
R=$OUT/issue33
. tools/device_setup.sh "$R"
cat "$R/env.txt"
# Each step's timeout is cut to what is left of CALL_LIMIT (the device call's timeout_s, default
# 590) less 25 s to pack the archive, so a long plan still returns its archive.
left() { local l=$(( ${CALL_LIMIT:-590} - SECONDS - 25 )); [ "$l" -lt "$1" ] && echo $(( l > 1 ? l : 1 )) || echo "$1"; }
[ "${SKIP_TESTS:-0}" = 1 ] || timeout "$(left "${TEST_TIMEOUT:-150}")" python3 -m pytest -q -rs -n "${TEST_PROCS:-2}" ${TEST_ARGS:-tests/ops/test_det_gemm.py} 2>&1 \
  | tee "$R/gpu-tests.log" | tail -8
[ "${SKIP_SWEEP:-0}" = 1 ] || timeout "$(left "${SWEEP_TIMEOUT:-240}")" python3 tools/det_gemm_prefill_sweep.py ${SWEEP_ARGS:-} --out "$R/sweep.json" 2>&1 \
  | tee "$R/sweep.log" | tail -45
[ "${SKIP_PROF:-0}" = 1 ] || timeout "$(left "${PROF_TIMEOUT:-150}")" python3 tools/train_step_profile.py ${PROF_ARGS:---batch 4 --seq-len 1024 --hf} \
  --json "$R/profile.json" 2>&1 | tee "$R/profile.log" | tail -70
if [ -n "${PROF_OLD_ARGS:-}" ]; then
  timeout "$(left "${PROF_TIMEOUT:-150}")" python3 tools/train_step_profile.py $PROF_OLD_ARGS --json "$R/profile-old.json" 2>&1 \
    | tee "$R/profile-old.log" | tail -30
fi
# sweep ARGS TIMEOUT TOOL NAME: run tools/TOOL with ARGS (a set variable; " " for the tool's
# defaults) into NAME.json / NAME.log; an unset or empty ARGS skips it
sweep() {
  [ -n "$1" ] || return 0
  # shellcheck disable=SC2086
  timeout "$(left "$2")" python3 "tools/$3" $1 --out "$R/$4.json" 2>&1 | tee "$R/$4.log" | tail -5
}
sweep "${ATTN_ARGS:-}" "${ATTN_TIMEOUT:-90}" attention_prefill_sweep.py attn_sweep
sweep "${LOGP_ARGS:-}" "${LOGP_TIMEOUT:-90}" linear_logp_sweep.py linear_logp_sweep
sweep "${SWIGLU_ARGS:-}" "${SWIGLU_TIMEOUT:-90}" gate_up_swiglu_sweep.py gate_up_swiglu_sweep
sweep "${REDUCE_ARGS:-}" "${REDUCE_TIMEOUT:-60}" rms_dw_reduce_sweep.py rms_dw_reduce_sweep
sweep "${DECLARED_ATTN_ARGS:-}" "${DECLARED_ATTN_TIMEOUT:-150}" attention_declared_time.py attention_declared
if [ -n "${BENCH_ARGS:-}" ]; then
  # shellcheck disable=SC2086
  timeout "$(left "${BENCH_TIMEOUT:-200}")" rl-engine bench $BENCH_ARGS --out "$R/bench" >"$R/bench-stdout.txt" 2>"$R/bench-progress.log"
  echo "bench rc $?"
  grep -v "Warn" "$R/bench-progress.log" | tail -n 40
fi
if [ -n "${NCU_KERNELS:-}" ]; then
  IFS=';' read -ra ncu_kernels <<<"$NCU_KERNELS"
  i=0
  for k in "${ncu_kernels[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    timeout "$(left "${NCU_TIMEOUT:-120}")" ncu --kernel-name-base demangled --kernel-name "regex:$k" \
      --launch-skip "${NCU_SKIP:-2}" --launch-count 1 --set full \
      ${NCU_CMD:-python3 tools/train_step_profile.py ${NCU_PROF_ARGS:---backend cuda_bf16 --modes train_step} --calls-only 1} \
      >"$R/ncu-$i.txt" 2>&1
    echo "ncu $i ($k): rc $?"
  done
fi
cd "$OUT" && tar czf issue33.tgz issue33 && rm -rf issue33
