"""``rl-engine bench``: time our kernels against their baselines; write bench.json, bench.md, bench.png.

Needs a CUDA GPU (exit 2 without one), except ``--dry-run``, which builds every row's inputs at
tiny shapes and runs each callable once on whatever device is here (the CPU with Triton's
interpreter), so CI proves the plumbing without timing anything.

Exit codes: 0 done; 1 one of our measurements raised, or ``--check-targets`` and a target was
missed; 2 bad usage (unknown op or backend, a named backend that cannot run, no GPU).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def register(sub) -> None:
    from rl_engine.cli.args import add_list, command

    p = command(sub, "bench", "benchmark the kernels against cuBLAS / SDPA / eager PyTorch / Liger, side by side", [
        "rl-engine bench --out bench-out --quick",
        "rl-engine bench --out bench-out --ops gemm,attention --backend triton_cuda_bf16",
        "rl-engine bench --out /tmp/b --dry-run              # no GPU needed: checks the plumbing only",
    ])
    add_list(p, "--ops", "OP",
             "bench items or families: det_gemm lm_head attention_fwd attention_fwd_bwd attention_decode "
             "rms_norm rope swiglu silu linear_logp chain_decode chain_generate chain_teacher_forcing chain_train_step "
             "| gemm attention norm logprob chain | all (default: all)")
    add_list(p, "--backend", "NAME", "triton_cuda_bf16, cuda_bf16, or all (default: all)")
    p.add_argument("--tokens", nargs="+", type=int, default=None, metavar="T",
                   help="token counts (GEMM M, prefill length, decode batch); default 1 16 128 1024 4096 8192, "
                        "with --quick 1 16 1024 8192")
    p.add_argument("--quick", action="store_true",
                   help="fewer shapes (tokens 1 16 1024 8192, three GEMM projections) and shorter timing "
                        "(warm-up 10 ms, repetitions 40 ms)")
    p.add_argument("--dry-run", action="store_true",
                   help="no timing: build every row's inputs at tiny shapes and call each implementation once")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    p.add_argument("--warmup-ms", type=float, default=None, metavar="MS",
                   help="do_bench warm-up time per measurement, e.g. 25 (default: 25, with --quick 10)")
    p.add_argument("--rep-ms", type=float, default=None, metavar="MS",
                   help="do_bench repetition time per measurement, e.g. 100 (default: 100, with --quick 40)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="after this many seconds, record the remaining cases as skipped and finish the reports")
    p.add_argument("--check-targets", action="store_true", help="exit 1 when a performance target (docs/decisions.md) is missed")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from rl_engine import env
    from rl_engine.bench.runner import (DEFAULT_REP_MS, DEFAULT_TOKENS, DEFAULT_WARMUP_MS, QUICK_REP_MS, QUICK_TOKENS,
                                        QUICK_WARMUP_MS, BenchConfig, check_backend_name, resolve_backends,
                                        resolve_ops, run_bench)
    from rl_engine.errors import RLEngineError

    args.backend = ",".join(args.backend) if args.backend else "all"
    if args.tokens is not None and any(t < 1 for t in args.tokens):
        raise RLEngineError(f"--tokens must be positive integers, got {args.tokens}")
    ops = resolve_ops(args.ops)  # unknown names exit 2 before anything else
    check_backend_name(args.backend)
    gpu = torch.cuda.is_available()
    if not gpu and not args.dry_run:
        raise RLEngineError("benchmarks need a CUDA GPU; none here (use --dry-run to check the plumbing on the CPU)")
    if not gpu and not env.triton_interpret():
        env.enable_triton_interpreter()  # before any kernel module is imported
    from rl_engine.bench import report

    backends, skipped = resolve_backends(args.backend, args.dry_run)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RLEngineError(f"cannot create output folder {out}: {exc.strerror}") from exc
    if not os.access(out, os.W_OK):
        raise RLEngineError(f"output folder {out} is not writable")
    tokens = sorted(set(args.tokens or (QUICK_TOKENS if args.quick else DEFAULT_TOKENS)))
    cfg = BenchConfig(
        ops=ops, backends=backends, tokens=tokens, out_dir=out, quick=args.quick, dry_run=args.dry_run,
        warmup_ms=args.warmup_ms if args.warmup_ms is not None else (QUICK_WARMUP_MS if args.quick else DEFAULT_WARMUP_MS),
        rep_ms=args.rep_ms if args.rep_ms is not None else (QUICK_REP_MS if args.quick else DEFAULT_REP_MS),
        seed=args.seed, time_budget_s=args.time_budget, requested_backend=args.backend, skipped_backends=skipped)
    where = "dry run (no timing)" + ("" if gpu else ", CPU with the Triton interpreter") if args.dry_run else "GPU"
    print(f"rl-engine bench: {where}; ops {', '.join(ops)}; backends {', '.join(backends) or 'none'}; tokens {tokens}",
          file=sys.stderr)
    for b, why in skipped.items():
        print(f"rl-engine bench: backend {b} skipped: {why}", file=sys.stderr)
    json_path, md_path, png_path = out / "bench.json", out / "bench.md", out / "bench.png"

    def progress(doc):
        report.write_json(json_path, doc, check=False)

    doc = run_bench(cfg, on_progress=progress)
    report.write_json(json_path, doc)
    report.write_md(md_path, doc)
    plotted = report.write_png(png_path, doc)
    s = doc["summary"]
    if args.json:
        print(json.dumps({"summary": s, "peaks": {k: doc["peaks"].get(k) for k in ("copy_gbps", "cublas_tflops")},
                          "bench_json": str(json_path), "bench_md": str(md_path),
                          "bench_png": str(png_path) if plotted else None, "wall_time_s": doc["wall_time_s"]}, indent=1))
    else:
        tail = "" if plotted else " (no plot: matplotlib missing)"
        print(f"{s['rows']} rows, {s['measured']} measured, {s['errors']} errors; targets met {s['targets_met']} / "
              f"{s['targets_judged']} judged ({doc['wall_time_s']:.1f} s) -> {json_path}, {md_path}"
              + (f", {png_path}" if plotted else "") + tail)
        for line in s["missed"]:
            print(f"  missed: {line}")
    if s["errors"]:
        return 1
    if args.check_targets and s["targets_missed"]:
        return 1
    return 0
