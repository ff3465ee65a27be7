#!/usr/bin/env bash
# Run on the lent H200 (device tool): install carried wheels, install the package, run
# `rl-engine bench` for both backends and leave bench.json / bench.md / bench.png under $OUT/bench.
#
# Designed to finish within ~8 minutes on one H200: the default shapes (tokens 1 16 128 1024 4096
# 8192, every op, both backends) are estimated at 3-5 minutes including Triton compilation and the
# cuda_bf16 library build (nvcc, uncached on a fresh machine). Two guards keep the call inside the
# device tool's 10-minute limit: --time-budget (default 400 s, counted from the start of the
# benchmark: later cases are recorded as skipped and the reports are still written) and a hard
# `timeout` (default 540 s; the per-case progress file then stays behind and bench.md is rendered
# from it). QUICK=1 uses --quick shapes (tokens 1 16 1024 8192, three GEMM projections, 10/40 ms timing).
#
# Usage: bash tools/h200_bench.sh [extra rl-engine bench args]
#   env: OUT (default /tmp/out), QUICK=1, BUDGET_S (400), HARD_TIMEOUT_S (540)
set -uo pipefail
# The caller passes RL_ENGINE_SOURCE_COMMIT / RL_ENGINE_SOURCE_DIRTY (they win over any git directory in the copy).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
. tools/device_setup.sh "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >"$OUT/gpu-before.txt" 2>&1
python3 -c "import liger_kernel" 2>/dev/null && echo "liger_kernel: importable" || echo "liger_kernel: not installed (Liger rows will say so)"
ARGS=(--out "$OUT/bench" --time-budget "${BUDGET_S:-400}")
[ "${QUICK:-0}" = "1" ] && ARGS+=(--quick)
start=$(date +%s)
timeout "${HARD_TIMEOUT_S:-540}" rl-engine bench "${ARGS[@]}" "$@" >"$OUT/bench-stdout.txt" 2>"$OUT/bench-progress.log"
rc=$?
echo "bench exit code $rc after $(( $(date +%s) - start )) s"
if [ "$rc" = "124" ] && [ -f "$OUT/bench/bench.json" ]; then
  echo "hard timeout: rendering bench.md from the partial bench.json"
  python3 -c "
import json, pathlib
from rl_engine.bench import report
p = pathlib.Path('$OUT/bench')
doc = json.loads((p / 'bench.json').read_text())
report.write_md(p / 'bench.md', doc)
report.write_png(p / 'bench.png', doc)
"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >"$OUT/gpu-after.txt" 2>&1
tail -n 25 "$OUT/bench-progress.log"
cat "$OUT/bench-stdout.txt"
# the rows that carry a target (and any errors), last in the output (the device tool returns the tail)
python3 - "$OUT/bench/bench.json" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
p = d.get("peaks") or {}
print(f"peaks: copy {p.get('copy_gbps')} GB/s, cuBLAS {p.get('cublas_tflops')} TFLOP/s; complete={d['complete']}")
print(json.dumps(d.get("summary"))[:1500])
errs = [r for r in d["rows"] if r["status"] == "error" or r["baseline_status"] == "error"]
print(f"{len(errs)} rows with an error (first 15 below)")
for r in errs[:15]:
        print(f"ERROR {r['op']} {r['variant']} {r['shape']} {r['backend']}: {r['note'] or ''} | baseline: {r['baseline_note'] or ''}"[:300])
for r in d["rows"]:
    if r["target"] is None or r["status"] != "measured":
        continue
    v = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
    t = "" if r["target"] is None else f" target {r['target_sense']}{r['target']:.2f} {'ok' if r['meets_target'] else ('MISS' if r['meets_target'] is False else 'n/a')}"
    print(f"{r['op']:17s} {r['variant'][:14]:14s} {r['shape'][:26]:26s} {r['backend'][:6]:6s} {r['value']:9.4g} {r['metric']:7s} {v}{t}")
PY
exit 0
