#!/usr/bin/env bash
# Run on the lent H200 (device tool): full ncu profiles (every section, stall sampling by SASS
# instruction) of the decode kernels that hold the cuda_bf16 step back at batch 16 / 64, beside the
# Triton kernels that do the same work faster, for issue #19. Writes $OUT/diag.tgz.
#   * the decode GEMV at M = 64, gate/up shape (4096 x 24576), cuda_bf16 ring and Triton leaves;
#   * the decode attention at B = 16, context 8192: cuda_bf16's two launches and Triton's one;
#   * which instructions Triton's compiled kernels use (wgmma, TMA, cp.async counts in the PTX).
set -uo pipefail
OUT=${OUT:-/tmp/out}
D="$OUT/diag"
mkdir -p "$D"
. tools/device_setup.sh "$D"
start=$(date +%s)
S="--clock-control none --set full"
timeout 150 ncu $S --kernel-name regex:gemv_leaf --launch-skip 2 --launch-count 1 \
  python3 tools/gemv_compare.py --once --ms 64 >"$D/ncu-gemv-cuda-m64.txt" 2>&1
echo "ncu gemv cuda rc $? after $(( $(date +%s) - start )) s"
timeout 150 ncu $S --kernel-name regex:_det_gemm_leaves --launch-skip 2 --launch-count 1 \
  python3 tools/gemv_compare.py --once --once-backend triton --ms 64 >"$D/ncu-gemv-triton-m64.txt" 2>&1
echo "ncu gemv triton rc $? after $(( $(date +%s) - start )) s"
timeout 150 ncu $S --kernel-name regex:attn_decode --launch-skip 2 --launch-count 2 \
  python3 tools/attention_decode_sweep.py --backend cuda --once 16:8192 >"$D/ncu-attn-cuda-B16-ctx8192.txt" 2>&1
echo "ncu attention cuda rc $? after $(( $(date +%s) - start )) s"
timeout 150 ncu $S --kernel-name regex:_attn_decode --launch-skip 1 --launch-count 1 \
  python3 tools/attention_decode_sweep.py --backend triton --once 16:8192 >"$D/ncu-attn-triton-B16-ctx8192.txt" 2>&1
echo "ncu attention triton rc $? after $(( $(date +%s) - start )) s"
for k in _det_gemm_leaves_kernel _attn_decode_kernel; do
  for f in $(find "${TRITON_CACHE_DIR:-$HOME/.triton/cache}" -name "$k.ptx" 2>/dev/null); do
    echo "$f: wgmma $(grep -c wgmma "$f"), cp.async.bulk.tensor $(grep -c cp.async.bulk.tensor "$f"), cp.async $(grep -c 'cp.async.cg\|cp.async.ca' "$f"), mma.sync $(grep -c mma.sync "$f"), ld.global $(grep -c ld.global "$f")"
  done
done >"$D/triton-ptx.txt" 2>&1
cat "$D/triton-ptx.txt"
for f in "$D"/ncu-*.txt; do
  echo "== $f"; grep -E "^  [a-z_<]|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Issued Warp Per|Warp Cycles Per Issued|Dynamic Shared|L2 Hit Rate" "$f" | cut -c1-160
done
(cd "$OUT" && tar czf diag.tgz diag && rm -rf diag)
exit 0
