"""Decode GEMVs of both kernel backends beside cuBLAS at the Qwen3-8B projection shapes (issue #19).

M = 1, 16 and 64, each timed as ``CALLS`` launches back to back in one CUDA graph (as in a captured
decode step), plus the bits of each backend's decode path against its own prefill form. Meant to
run under ``ncu`` too (``--once`` launches each shape once, untimed, for a kernel profile).
``--variants``: the CUDA side once per ring geometry of its decode GEMV
(:func:`rl_engine.ops.det_gemm.cuda.set_gemv_variant`), each with its bits against the fused form.

Usage: ``python tools/gemv_compare.py [--once] [--variants]``
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

from rl_engine.graphs import time_per_call
from rl_engine.ops.det_gemm import cuda as dg_cuda
from rl_engine.ops.det_gemm import triton as dg_triton

SHAPES = {"q/o": (4096, 4096), "k/v": (4096, 1024), "gate/up": (4096, 12288), "down": (12288, 4096)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--variants", action="store_true")
    args = ap.parse_args()
    variants = range(dg_cuda.GEMV_VARIANTS) if args.variants else (0,)
    dev = torch.device("cuda")
    if not args.once:
        src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        copy = 2 * src.numel() / triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100) / 1e6
        del src, dst
        print(f"copy bandwidth {copy:.0f} GB/s")
    for name, (k, n) in SHAPES.items():
        g = torch.Generator(device=dev).manual_seed(k + n)
        w = (torch.randn((n, k), generator=g, device=dev) * k ** -0.5).to(torch.bfloat16)
        for m in (1, 16, 64):
            a = torch.randn((m, k), generator=g, device=dev).to(torch.bfloat16)
            if args.once:
                dg_cuda.det_gemm_launch(a, w.t(), 2)
                torch.cuda.synchronize()
                continue
            fused = dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=False).view(torch.int16)
            t = {"cuBLAS": time_per_call(lambda: a @ w.t()),
                 "triton": time_per_call(lambda: dg_triton.det_gemm_launch(a, w.t(), 2, False))}
            same = []
            for v in variants:
                dg_cuda.set_gemv_variant(v)
                same.append(torch.equal(dg_cuda.det_gemm_launch(a, w.t(), 2).view(torch.int16), fused))
                t[f"cuda[{v}]"] = time_per_call(lambda: dg_cuda.det_gemm_launch(a, w.t(), 2))
            dg_cuda.set_gemv_variant(0)
            nbytes = 2 * (n * k + m * k + m * n)
            print(f"{name:8s} M={m:2d}: " + ", ".join(f"{key} {ms * 1e3:6.1f} us ({nbytes / ms / 1e6 / copy:.2f} of copy)"
                                                     for key, ms in t.items())
                  + f"; cuda decode = fused bits {all(same)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
