"""Where one Qwen3-8B decode step spends its GPU time (issue #19): torch.profiler over replays of
the captured step (``rl_engine.bench.chain``'s step: forward, lm_head, sampler), per kernel name.

Usage: ``python tools/decode_profile.py [--backend triton_cuda_bf16] [--batch 1] [--context 1024]
[--replays 5] [--json PATH] [--pdl 0|1|2] [--pdl-attention 0|1|2] [--tile-gemv-min-m M]
[--declared-decode-form auto|walk|split]``. Prints the step's wall time per replay (CUDA events), the summed
kernel time per replay, the number of kernels per replay, and the kernels by total time.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="triton_cuda_bf16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default=None)
    ap.add_argument("--pdl", type=int, default=None, choices=(0, 1, 2),
                    help="cuda_bf16's PDL mode of the decode forward (rl_engine.chain.fused.CUDA_DECODE_PDL), "
                         "at any batch")
    ap.add_argument("--pdl-attention", type=int, default=None, choices=(0, 1, 2),
                    help="the PDL mode of cuda_bf16's decode attention launches only")
    ap.add_argument("--tile-gemv-min-m", type=int, default=None,
                    help="cuda_bf16: the tile-form decode GEMV from this many rows up (default 17; below it the "
                         "warp GEMV), rl_engine.ops.det_gemm.cuda.set_tile_gemv_min_m")
    ap.add_argument("--gemv-variant", type=int, default=None,
                    help="cuda_bf16: the decode GEMV variant for every product the warp GEMV does not take "
                         "(rl_engine.ops.det_gemm.cuda.set_gemv_variant; default 0)")
    ap.add_argument("--declared-decode-form", default=None, choices=("auto", "walk", "split"),
                    help="cuda_bf16: the declared attention form's decode step "
                         "(rl_engine.ops.attention.cuda.set_declared_decode_form; default: the library's)")
    args = ap.parse_args()
    from rl_engine.chain import fused

    if args.declared_decode_form is not None:
        from rl_engine.ops.attention.cuda import set_declared_decode_form

        set_declared_decode_form(args.declared_decode_form)

    if args.gemv_variant is not None:
        from rl_engine.ops.det_gemm.cuda import set_gemv_variant

        set_gemv_variant(args.gemv_variant)

    if args.tile_gemv_min_m is not None:
        from rl_engine.ops.det_gemm.cuda import set_tile_gemv_min_m

        set_tile_gemv_min_m(args.tile_gemv_min_m)

    if args.pdl is not None:  # the decode forward's mode (the lm_head and sampler launch plainly)
        fused.CUDA_DECODE_PDL = args.pdl
        fused.CUDA_DECODE_PDL_MAX_BATCH = max(fused.CUDA_DECODE_PDL_MAX_BATCH, args.batch)
    if args.pdl_attention is not None:  # the decode attention's two launches in their own mode
        import rl_engine.ops.attention.cuda as attention_cuda
        from rl_engine.backends.cuda_launch import programmatic_launch

        plain_launch = attention_cuda.launch

        def attention_launch(device, name, *a):
            with programmatic_launch(args.pdl_attention):
                plain_launch(device, name, *a)

        attention_cuda.launch = attention_launch
    from rl_engine.bench import chain
    from rl_engine.bench.common import QWEN3_8B, Pool
    from rl_engine.chain.model import Qwen3Model

    st = chain._build({"B": args.batch, "context": args.context}, QWEN3_8B, Pool(torch.device("cuda"), 0))
    model = Qwen3Model(st["weights"], args.backend)
    step = chain.decode_step_fn(model, st)
    from rl_engine.graphs import capture

    graph, _ = capture(step)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(args.replays):
        graph.replay()
    t1.record()
    torch.cuda.synchronize()
    wall_ms = t0.elapsed_time(t1) / args.replays
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.replays):
            graph.replay()
        torch.cuda.synchronize()
    per_name: dict[str, list[float]] = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_name[e.name].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    total_us = sum(sum(v) for v in per_name.values()) / args.replays
    launches = sum(len(v) for v in per_name.values()) / args.replays
    bound = chain.step_bytes(model.config, args.batch, args.context)
    print(f"{args.backend} B={args.batch} ctx={args.context}: graph replay {wall_ms:.3f} ms/step, kernel time "
          f"{total_us / 1e3:.3f} ms/step over {launches:.0f} kernels; bytes to read {bound / 1e9:.2f} GB")
    rows = sorted(((sum(v) / args.replays, len(v) / args.replays, k) for k, v in per_name.items()), reverse=True)
    for us, n, name in rows[: args.top]:
        print(f"  {us / 1e3:8.3f} ms {n:6.0f}x  {name[:110]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"backend": args.backend, "batch": args.batch, "context": args.context, "wall_ms": wall_ms,
                       "kernel_ms": total_us / 1e3, "kernels": launches, "bytes": bound,
                       "by_kernel": [{"name": k, "ms": us / 1e3, "count": n} for us, n, k in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
