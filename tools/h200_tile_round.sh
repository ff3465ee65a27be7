#!/usr/bin/env bash
# Run on the lent H200 (device tool), issue #19: time the cuda_bf16 decode GEMV's tile form against
# the ring at M = 16 and 64; when a tile geometry is faster at M = 64 over the four Qwen3-8B
# products, make it the default from M = 17 up for the rest of the call (a sed of GV_TILE_MIN_M /
# GV_TILE_DEFAULT in gemm.cu; committed only after the call passed), then run the GPU tests of the
# GEMV paths, the decode bench and as much of the cuda_bf16 gate as the call leaves time for.
# env: OUT, RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY, CALL_LIMIT (s, default 560).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/tile"
. tools/device_setup.sh "$OUT/tile"
start=$(date +%s)
timeout 150 python3 tools/gemv_compare.py --ring-variants 0,6,7,8 --ms 16,64 >"$OUT/tile/gemv-compare.txt" 2>&1
echo "gemv compare rc $? after $(( $(date +%s) - start )) s"; grep -v Warn "$OUT/tile/gemv-compare.txt" | tail -n 12
choice=$(python3 - "$OUT/tile/gemv-compare.txt" <<'PY'
import re, sys
tot = {}
for line in open(sys.argv[1]):
    if " M=64:" not in line or line.startswith("logits"):
        continue
    for v, us in re.findall(r"cuda ring\[(\d+)\]\s+([\d.]+) us", line):
        tot[int(v)] = tot.get(int(v), 0.0) + float(us)
best = min((v for v in tot if v != 0), key=lambda v: tot[v], default=None)
print(best if best is not None and 0 in tot and tot[best] < tot[0] else "none", *(f"{v}:{t:.1f}" for v, t in sorted(tot.items())))
PY
)
echo "M = 64 sums (us) and choice: $choice"
v=${choice%% *}
if [ "$v" != "none" ]; then
  sed -i "s/^constexpr int64_t GV_TILE_MIN_M = 65;/constexpr int64_t GV_TILE_MIN_M = 17;/; s/^constexpr int GV_TILE_DEFAULT = [0-9];/constexpr int GV_TILE_DEFAULT = $v;/" \
    rl_engine/backends/cuda_src/gemm.cu
  grep -n "^constexpr int64_t GV_TILE_MIN_M\|^constexpr int GV_TILE_DEFAULT" rl_engine/backends/cuda_src/gemm.cu
  export RL_ENGINE_SOURCE_DIRTY=1  # the tree now differs from the commit by that default (provenance says so)
fi
timeout 150 python3 -m pytest -q -o addopts=-ra -m gpu tests/ops/test_cuda_backend.py -k "gemv or decode_form or lm_head" \
  >"$OUT/tile/gpu-tests.log" 2>&1
echo "tests rc $? after $(( $(date +%s) - start )) s"; tail -n 4 "$OUT/tile/gpu-tests.log"
timeout 120 rl-engine bench --ops chain_decode --out "$OUT/tile/bench" >"$OUT/tile/bench-stdout.txt" 2>"$OUT/tile/bench-progress.log"
echo "bench rc $? after $(( $(date +%s) - start )) s"; grep -v Warning "$OUT/tile/bench-progress.log" | grep -v rotary | tail -n 12
left=$(( ${CALL_LIMIT:-560} - ($(date +%s) - start) - 30 ))
if [ "$left" -gt 60 ]; then
  timeout "$left" rl-engine gate --backend cuda_bf16 --out "$OUT/tile/gate" 2>"$OUT/tile/gate-progress.log"
  echo "gate rc $? after $(( $(date +%s) - start )) s"; tail -n 6 "$OUT/tile/gate-progress.log"
fi
(cd "$OUT" && tar czf tile.tgz tile && rm -rf tile)
exit 0
