"""Decode GEMVs of both kernel backends beside cuBLAS at the Qwen3-8B projection shapes (issue #19).

M = 1, 16 and 64, each timed as launches back to back in one CUDA graph (as in a captured decode
step) over copies of the weight that do not fit the L2, plus the bits of each backend's decode
path against its own prefill form, and the FP32 logits GEMV of ``lm_head`` (V = 151936). Meant to
run under ``ncu`` too (``--once`` launches each shape once, untimed, for a kernel profile).
``--variants``: the CUDA side once per ring geometry of its decode GEMV
(:func:`rl_engine.ops.det_gemm.cuda.set_gemv_variant`) and per geometry of its warp GEMV
(:func:`~rl_engine.ops.det_gemm.cuda.set_warp_gemv_variant`), each with its bits against the fused form.
At M <= 16 the CUDA side is timed in both decode forms: the ring GEMV with its merge launch and the
warp-streamed GEMV (``warp_gemv=True``, :data:`rl_engine.ops.det_gemm.cuda.WARP_GEMV_ON_CUDA`).

``--cross-bits``: only whether the two backends give the same bits (det_gemm and logits), untimed.

Usage: ``python tools/gemv_compare.py [--cross-bits] [--once [--once-backend triton]] [--variants | --ring-variants 0,3] [--ms 1,16,64]``
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

from rl_engine.graphs import time_per_call
from rl_engine.ops.det_gemm import cuda as dg_cuda
from rl_engine.ops.det_gemm import triton as dg_triton

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 24576), "down": (12288, 4096)}
"""K x N of the products a Qwen3-8B decode step runs (the engine packs q/k/v and gate/up)."""

ROTATE_BYTES = 512 << 20
"""Each timed graph cycles through copies of the weight totalling at least this (ten times the
H200's 50 MB L2), so that back-to-back calls read HBM as a decode step does, not the L2."""


def _weights(n: int, k: int, dev: torch.device, seed: int) -> list[torch.Tensor]:
    g = torch.Generator(device=dev).manual_seed(seed)
    w = (torch.randn((n, k), generator=g, device=dev) * k ** -0.5).to(torch.bfloat16)
    return [w] + [w.clone() for _ in range(-(-ROTATE_BYTES // (2 * n * k)) - 1)]


def _cycled(fn, ws):
    """A zero-argument call of ``fn(w)`` that takes the next weight of ``ws`` each time."""
    state = {"i": 0}

    def call():
        w = ws[state["i"] % len(ws)]
        state["i"] += 1
        return fn(w)
    return call


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--once-backend", choices=("cuda", "triton"), default="cuda",
                    help="the backend whose decode GEMVs --once launches (default cuda)")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--ring-variants", default=None, help="comma-separated ring / tile variants to time (the warp GEMV only in its default geometry)")
    ap.add_argument("--ms", default="1,16,64", help="comma-separated M values (default 1,16,64)")
    ap.add_argument("--cross-bits", action="store_true",
                    help="only compare the two backends' det_gemm and logits bits at every shape and M, untimed")
    args = ap.parse_args()
    ms = tuple(int(v) for v in args.ms.split(","))
    if args.cross_bits:
        return _cross_bits(ms)
    if args.ring_variants:
        variants = tuple(int(v) for v in args.ring_variants.split(","))
    else:
        variants = range(dg_cuda.GEMV_VARIANTS) if args.variants else (0,)
    warp_variants = range(dg_cuda.WARP_GEMV_VARIANTS) if args.variants else (0,)
    dev = torch.device("cuda")
    copy = float("nan")
    if not args.once:
        src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        dst = torch.empty_like(src)
        copy = 2 * src.numel() / triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100) / 1e6
        del src, dst
        print(f"copy bandwidth {copy:.0f} GB/s (weights cycled over >= {ROTATE_BYTES >> 20} MB per graph)")
    for name, (k, n) in SHAPES.items():
        ws = _weights(n, k, dev, k + n)
        w = ws[0]
        g = torch.Generator(device=dev).manual_seed(n)
        for m in ms:
            a = torch.randn((m, k), generator=g, device=dev).to(torch.bfloat16)
            if args.once and args.once_backend == "triton":
                dg_triton.det_gemm_launch(a, w.t(), 2, False)
                torch.cuda.synchronize()
                continue
            if args.once:
                dg_cuda.det_gemm_launch(a, w.t(), 2, warp_gemv=m <= 16)
                torch.cuda.synchronize()
                continue
            fused = dg_cuda.det_gemm_launch(a, w.t(), 2, leaf_split=False).view(torch.int16)
            t = {"cuBLAS": time_per_call(_cycled(lambda x: a @ x.t(), ws)),
                 "triton": time_per_call(_cycled(lambda x: dg_triton.det_gemm_launch(a, x.t(), 2, False), ws))}
            same = []
            for v in variants:
                dg_cuda.set_gemv_variant(v)
                same.append(torch.equal(dg_cuda.det_gemm_launch(a, w.t(), 2, warp_gemv=False).view(torch.int16), fused))
                t[f"cuda ring[{v}]"] = time_per_call(
                    _cycled(lambda x: dg_cuda.det_gemm_launch(a, x.t(), 2, warp_gemv=False), ws))
            dg_cuda.set_gemv_variant(0)
            if m <= 16:  # the warp-streamed GEMV (gemv_warp_kernel), merges included, per geometry
                for v in warp_variants:
                    dg_cuda.set_warp_gemv_variant(v)
                    same.append(torch.equal(dg_cuda.det_gemm_launch(a, w.t(), 2, warp_gemv=True).view(torch.int16),
                                            fused))
                    t[f"cuda warp[{v}]"] = time_per_call(
                        _cycled(lambda x: dg_cuda.det_gemm_launch(a, x.t(), 2, warp_gemv=True), ws))
                dg_cuda.set_warp_gemv_variant(0)
            nbytes = 2 * (n * k + m * k + m * n)
            print(f"{name:8s} M={m:2d}: " + ", ".join(f"{key} {ms * 1e3:6.1f} us ({nbytes / ms / 1e6 / copy:.2f} of copy)"
                                                     for key, ms in t.items())
                  + f"; cuda decode = fused bits {all(same)}")
        del ws, w
    # The logits GEMV (lm_head, FP32 output, one leaf): 1.24 GB, larger than any cache.
    from rl_engine.ops.lm_head import cuda as lm_cuda
    from rl_engine.ops.lm_head import triton as lm_triton

    k, n = 4096, 151936
    g = torch.Generator(device=dev).manual_seed(7)
    w = (torch.randn((n, k), generator=g, device=dev) * k ** -0.5).to(torch.bfloat16)
    for m in ms:
        a = torch.randn((m, k), generator=g, device=dev).to(torch.bfloat16)
        if args.once:
            lm_cuda.gemm_f32_out(a, w.t(), warp_gemv=m <= 16)
            torch.cuda.synchronize()
            continue
        big = lm_cuda.gemm_f32_out(torch.cat([a, a[:1].repeat(70, 1)]), w.t())[:m]  # the 128 x 128 kernel
        forms = (False, True) if m <= 16 else (False,)
        same = all(torch.equal(lm_cuda.gemm_f32_out(a, w.t(), warp_gemv=f).view(torch.int32), big.view(torch.int32))
                   for f in forms)
        t = {"cuBLAS (BF16 out)": time_per_call(lambda: a @ w.t(), calls=4),
             "triton": time_per_call(lambda: lm_triton.lm_head_fwd(a, w), calls=4),
             "cuda ring": time_per_call(lambda: lm_cuda.gemm_f32_out(a, w.t(), warp_gemv=False), calls=4)}
        if m <= 16:
            for v in warp_variants:
                dg_cuda.set_warp_gemv_variant(v)
                t[f"cuda warp[{v}]"] = time_per_call(lambda: lm_cuda.gemm_f32_out(a, w.t(), warp_gemv=True), calls=4)
            dg_cuda.set_warp_gemv_variant(0)
        nbytes = 2 * (n * k + m * k) + 4 * m * n
        print(f"logits   M={m:2d}: " + ", ".join(f"{key} {ms * 1e3:6.1f} us ({nbytes / ms / 1e6 / copy:.2f} of copy)"
                                                 for key, ms in t.items())
              + f"; cuda decode = prefill bits {same}")
    return 0


def _cross_bits(ms: tuple[int, ...]) -> int:
    """Whether triton_cuda_bf16 and cuda_bf16 give the same det_gemm (depth 2) and FP32 logits bits
    at the Qwen3-8B decode shapes. Both declare the same K tree and 16-wide k chunks in increasing
    order inside a leaf (Triton: BK = 64 steps of tl.dot, which its Hopper build issues as wgmma at
    M = 64; CUDA: 32-wide steps of mma.sync m16n8k16), so equal bits say the two instructions round
    the same FP32 accumulation. A report, not a claim of the contract."""
    from rl_engine.ops.lm_head import cuda as lm_cuda
    from rl_engine.ops.lm_head import triton as lm_triton

    dev = torch.device("cuda")
    for name, (k, n) in SHAPES.items():
        g = torch.Generator(device=dev).manual_seed(k + n)
        w = (torch.randn((n, k), generator=g, device=dev) * k ** -0.5).to(torch.bfloat16)
        for m in ms:
            a = torch.randn((m, k), generator=g, device=dev).to(torch.bfloat16)
            ct = dg_cuda.det_gemm_launch(a, w.t(), 2)
            tt = dg_triton.det_gemm_launch(a, w.t(), 2, False)
            diff = int((ct.view(torch.int16) != tt.view(torch.int16)).sum())
            print(f"{name:8s} M={m:2d}: det_gemm cuda == triton bits {diff == 0} ({diff} of {ct.numel()} differ)")
    k, n = 4096, 151936
    g = torch.Generator(device=dev).manual_seed(7)
    w = (torch.randn((n, k), generator=g, device=dev) * k ** -0.5).to(torch.bfloat16)
    for m in ms:
        a = torch.randn((m, k), generator=g, device=dev).to(torch.bfloat16)
        ct = lm_cuda.gemm_f32_out(a, w.t())
        tt = lm_triton.lm_head_fwd(a, w)
        diff = int((ct.view(torch.int32) != tt.view(torch.int32)).sum())
        print(f"logits   M={m:2d}: cuda == triton bits {diff == 0} ({diff} of {ct.numel()} differ)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
