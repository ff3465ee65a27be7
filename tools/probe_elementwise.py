"""GPU probe (H200): where do the Triton and CUDA elementwise kernels differ, and which Triton
formulation of exp / division gives the CUDA backend's bits? Prints PTX instruction counts of the
package's silu/swiglu backward kernels and bitwise mismatch counts of candidate formulations
against the CUDA library on Qwen3-8B-sized inputs. Diagnostic only (no claim rests on it).

Usage (on the GPU machine): python3 tools/probe_elementwise.py
"""

from __future__ import annotations

import re
from collections import Counter

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from rl_engine.ops.silu.api import silu_cuda, silu_triton
from rl_engine.ops.swiglu.api import swiglu_cuda, swiglu_triton


@triton.jit
def _sig(x_ptr, o_ptr, n, VARIANT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0).to(tl.float32)
    if VARIANT == 0:  # as the package writes it
        s = 1.0 / (1.0 + tl.exp(-x))
    elif VARIANT == 1:  # IEEE division
        s = tl.math.div_rn(tl.full((BLOCK,), 1.0, tl.float32), 1.0 + tl.exp(-x))
    elif VARIANT == 2:  # libdevice exp (CUDA expf) + IEEE division
        s = tl.math.div_rn(tl.full((BLOCK,), 1.0, tl.float32), 1.0 + libdevice.exp(-x))
    else:  # libdevice exp, plain division
        s = 1.0 / (1.0 + libdevice.exp(-x))
    tl.store(o_ptr + i, s, mask=m)


def ptx_counts(compiled) -> Counter:
    ptx = compiled.asm["ptx"]
    ops = re.findall(r"^\s*(ex2\.[\w.]+|div\.[\w.]+|rcp\.[\w.]+|fma\.[\w.]+|lg2\.[\w.]+|sqrt\.[\w.]+|rsqrt\.[\w.]+)", ptx, re.M)
    return Counter(ops)


def main() -> None:
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.randn((4096, 12288), generator=g, device=dev) * 3).to(torch.bfloat16)
    up = (torch.randn((4096, 12288), generator=g, device=dev) * 2).to(torch.bfloat16)
    dy = torch.randn((4096, 12288), generator=g, device=dev).to(torch.bfloat16)
    # reference s as CUDA computes it: 1.0f / (1.0f + expf(-x)) (torch's CUDA exp is expf, IEEE division)
    xf = x.float().reshape(-1)
    s_ref = 1.0 / (1.0 + torch.exp(-xf))
    n = xf.numel()
    for v in range(4):
        out = torch.empty_like(xf)
        k = _sig[(triton.cdiv(n, 1024),)](xf, out, n, VARIANT=v, BLOCK=1024, enable_fp_fusion=False)
        diff = int((out.view(torch.int32) != s_ref.view(torch.int32)).sum())
        print(f"sigmoid variant {v}: {diff} of {n} differ from torch 1/(1+exp(-x)); ptx {dict(ptx_counts(k))}")
    # the package kernels against each other, forward and backward
    for name, tri, cu, args in (("silu", silu_triton, silu_cuda, (x,)), ("swiglu", swiglu_triton, swiglu_cuda, (x, up))):
        outs = []
        for fn in (tri, cu):
            a = [t.detach().clone().requires_grad_(True) for t in args]
            y = fn(*a)
            grads = torch.autograd.grad(y, a, dy)
            outs.append((y, *grads))
        for i, (p, q) in enumerate(zip(*outs)):
            d = int((p.view(torch.int16) != q.view(torch.int16)).sum())
            print(f"{name} output {i}: {d} of {p.numel()} differ (triton vs cuda)")
    from rl_engine.ops.silu import triton as silu_mod

    t, f = x.shape
    y = torch.empty_like(x)
    k = silu_mod._silu_fwd_kernel[(t, triton.cdiv(f, silu_mod.BLOCK))](x, y, f, x.stride(0), y.stride(0),
                                                                        BLOCK=silu_mod.BLOCK, enable_fp_fusion=False)
    print("silu fwd ptx", dict(ptx_counts(k)))
    k = silu_mod._silu_bwd_kernel[(t, triton.cdiv(f, silu_mod.BLOCK))](x, dy, y, f, x.stride(0), dy.stride(0), y.stride(0),
                                                                        BLOCK=silu_mod.BLOCK, enable_fp_fusion=False)
    print("silu bwd ptx", dict(ptx_counts(k)))


if __name__ == "__main__":
    main()
