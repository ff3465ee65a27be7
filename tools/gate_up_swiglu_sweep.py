"""Time the fused gate / up projection + SwiGLU kernel against det_gemm then swiglu, and against
cuBLAS then PyTorch's SwiGLU, on a GPU (issue #33).

Qwen3-8B MLP shapes: a [M, 4096] @ the gate and up weights [12288, 4096] each read through its
transpose, M tokens. The fused kernel's output must equal det_gemm then swiglu bit for bit; times
with ``triton.testing.do_bench``. Usage::

    python tools/gate_up_swiglu_sweep.py --ms 4096,8192 --out gate_up_swiglu_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ms", default="4096,8192")
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--f", type=int, default=12288)
    p.add_argument("--out", default="gate_up_swiglu_sweep.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from triton.testing import do_bench

    from rl_engine.ops.det_gemm import triton as dg
    from rl_engine.ops.swiglu.triton import swiglu_fwd

    g = torch.Generator(device="cuda").manual_seed(3)
    w_gate, w_up = ((torch.randn((args.f, args.k), generator=g, device="cuda") * args.k ** -0.5)
                    .to(torch.bfloat16).t() for _ in range(2))
    depth = dg.TREE_DEPTH
    rows = []
    for m in (int(x) for x in args.ms.split(",")):
        a = torch.randn((m, args.k), generator=g, device="cuda").to(torch.bfloat16)

        def separate():
            return swiglu_fwd(dg.det_gemm_launch(a, w_gate, depth), dg.det_gemm_launch(a, w_up, depth))

        def fused():
            return dg.det_gemm_swiglu_launch(a, w_gate, w_up, depth, fused=True)

        def cublas():
            return torch.nn.functional.silu(a @ w_gate) * (a @ w_up)

        same = torch.equal(fused().view(torch.int16), separate().view(torch.int16))
        ms = {name: float(do_bench(fn)) for name, fn in (("fused", fused), ("separate", separate), ("cublas", cublas))}
        rows.append({"M": m, "K": args.k, "F": args.f, **{f"{k}_ms": v for k, v in ms.items()}, "bits_equal": same})
        print(f"M {m}: fused {ms['fused']:.2f} ms, det_gemm + swiglu {ms['separate']:.2f} ms, cuBLAS + torch "
              f"{ms['cublas']:.2f} ms{'' if same else ' !BITS'}", flush=True)
    with open(args.out, "w") as fh:
        json.dump({"tool": "tools/gate_up_swiglu_sweep.py", "argv": sys.argv[1:],
                   "device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    return 0 if all(r["bits_equal"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
