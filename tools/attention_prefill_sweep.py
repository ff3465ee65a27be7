"""Sweep the launch settings of the Triton varlen attention forward on a GPU (issue #33).

Causal GQA at Qwen3-8B head shapes (32 query heads, 8 KV heads, D = 128), B packed sequences of
L tokens. For each configuration ``BLOCK_M x WARPS x STAGES`` (``BLOCK_N`` is the declared KV
block and never varies) this checks the output and lse bits against the module's defaults and
times it with ``triton.testing.do_bench``, beside ``torch.nn.functional.scaled_dot_product_attention``
(flash backend, ``[B, H, L, D]``, ``enable_gqa``) on the same values. A configuration with other bits
is reported and must never be chosen. Usage on the H200::

    python tools/attention_prefill_sweep.py --shapes 4x1024,2x8192 --out attn_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

DEFAULT_CONFIGS = ("64x4x2", "128x4x2", "128x8x2", "128x8x3", "64x4x3", "128x4x3")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4x1024,8x1024,2x8192", help="BxL, comma-separated")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="BLOCK_MxWARPSxSTAGES")
    p.add_argument("--out", default="attention_prefill_sweep.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from triton.testing import do_bench

    from rl_engine.ops.attention import triton as at
    from rl_engine.ops.attention._checks import LaunchPlan

    h, hkv, d = 32, 8, 128
    scale = d ** -0.5
    rows = []
    for shape in args.shapes.split(","):
        b, n = (int(x) for x in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(b * 31 + n)
        t = b * n
        q = torch.randn((t, h, d), generator=g, device="cuda").to(torch.bfloat16)
        k = torch.randn((t, hkv, d), generator=g, device="cuda").to(torch.bfloat16)
        v = torch.randn((t, hkv, d), generator=g, device="cuda").to(torch.bfloat16)
        cu = torch.arange(0, t + 1, n, dtype=torch.int32, device="cuda")
        plan = LaunchPlan(b, n, n)
        ref_out, ref_lse = at.attention_fwd(q, k, v, cu, cu, scale, plan)
        flops = 4 * b * (n * (n + 1) // 2) * h * d
        qs, ks, vs = (x.view(b, n, -1, d).transpose(1, 2) for x in (q, k, v))
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            sdpa_ms = float(do_bench(lambda: torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)))
        line = [f"B{b} L{n}: sdpa flash {flops / sdpa_ms / 1e9:6.1f} TF/s"]
        for cfg in args.configs.split(","):
            bm, warps, stages = (int(x) for x in cfg.split("x"))
            try:
                out, lse = at.attention_fwd(q, k, v, cu, cu, scale, plan, block_m=bm, num_warps=warps,
                                            num_stages=stages)
                same = bool(torch.equal(out.view(torch.int16), ref_out.view(torch.int16))
                            and torch.equal(lse.view(torch.int32), ref_lse.view(torch.int32)))
                ms = float(do_bench(lambda: at.attention_fwd(q, k, v, cu, cu, scale, plan, block_m=bm,
                                                             num_warps=warps, num_stages=stages)))
                rows.append({"B": b, "L": n, "config": cfg, "ms": ms, "sdpa_ms": sdpa_ms, "ratio": sdpa_ms / ms,
                             "bits_equal": same})
                line.append(f"{cfg}={sdpa_ms / ms:.2f}{'' if same else '!BITS'}")
            except Exception as exc:
                rows.append({"B": b, "L": n, "config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                line.append(f"{cfg}=err")
        print(" ".join(line), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"tool": "tools/attention_prefill_sweep.py", "argv": sys.argv[1:],
                   "device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    return 1 if any(r.get("bits_equal") is False for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
