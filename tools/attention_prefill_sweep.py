"""Sweep the launch settings of the Triton varlen attention forward on a GPU (issue #33).

Causal GQA at Qwen3-8B head shapes (32 query heads, 8 KV heads, D = 128), B packed sequences of
L tokens. For each configuration ``BLOCK_M x WARPS x STAGES[a]`` (``BLOCK_N`` is the declared KV
block and never varies; ``a``: the scores of the next KV block issued ahead, ``QK_AHEAD``) this checks the output and lse bits against the module's defaults and
times it with ``triton.testing.do_bench``, beside ``torch.nn.functional.scaled_dot_product_attention``
(flash backend, ``[B, H, L, D]``, ``enable_gqa``) on the same values. A configuration with other bits
is reported and must never be chosen. With ``--bwd-configs`` it also sweeps the backward's launch
settings (``KVROWSxWARPSxSTAGES[xSTEP][t]/QROWSxWARPSxSTAGES[xSTEP]`` of the dK/dV and dQ kernels:
STEP the reduction step, query rows per dK/dV step and keys per dQ step, a multiple of 16; ``t``
the dK/dV kernel's complete query blocks through TMA): dq, dk, dv bits against the defaults, time
against SDPA flash's backward (``torch.autograd.grad`` of its output on the same values). Usage on
the H200::

    python tools/attention_prefill_sweep.py --shapes 4x1024,2x8192 --out attn_sweep.json
    python tools/attention_prefill_sweep.py --configs 64x4x2 --bwd-configs 64x4x2/64x4x2,128x8x3x32t/64x4x2
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

DEFAULT_CONFIGS = ("64x4x2", "128x4x2", "128x8x2", "128x8x3", "64x4x3", "128x4x3")


def _launch(text: str) -> tuple[int, ...]:
    """``ROWSxWARPSxSTAGES[xSTEP]`` -> the launch tuple (STEP: the backward's reduction step)."""
    fields = tuple(int(x) for x in text.split("x"))
    if len(fields) not in (3, 4):
        raise SystemExit(f"launch {text!r}: expected ROWSxWARPSxSTAGES[xSTEP]")
    return fields


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="4x1024,8x1024,2x8192", help="BxL, comma-separated")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="BLOCK_MxWARPSxSTAGES[a], comma-separated (a: QK_AHEAD)")
    p.add_argument("--bwd-configs", default="", help="KVROWSxWARPSxSTAGES[xQSTEP][t]/QROWSxWARPSxSTAGES[xKVSTEP], comma-separated (t: the dK/dV "
                        "kernel's complete query blocks through TMA)")
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
            ahead = cfg.endswith("a")
            bm, warps, stages = (int(x) for x in cfg.removesuffix("a").split("x"))
            try:
                out, lse = at.attention_fwd(q, k, v, cu, cu, scale, plan, block_m=bm, num_warps=warps,
                                            num_stages=stages, qk_ahead=ahead)
                same = bool(torch.equal(out.view(torch.int16), ref_out.view(torch.int16))
                            and torch.equal(lse.view(torch.int32), ref_lse.view(torch.int32)))
                ms = float(do_bench(lambda: at.attention_fwd(q, k, v, cu, cu, scale, plan, block_m=bm,
                                                             num_warps=warps, num_stages=stages, qk_ahead=ahead)))
                rows.append({"B": b, "L": n, "config": cfg, "ms": ms, "sdpa_ms": sdpa_ms, "ratio": sdpa_ms / ms,
                             "bits_equal": same})
                line.append(f"{cfg}={sdpa_ms / ms:.2f}{'' if same else '!BITS'}")
            except Exception as exc:
                rows.append({"B": b, "L": n, "config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                line.append(f"{cfg}=err")
        print(" ".join(line), flush=True)
        if args.bwd_configs:
            do = torch.randn((t, h, d), generator=g, device="cuda").to(torch.bfloat16)
            ql, kl, vl = (x.detach().requires_grad_(True) for x in (qs, ks, vs))
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                o4 = torch.nn.functional.scaled_dot_product_attention(ql, kl, vl, is_causal=True, scale=scale,
                                                                      enable_gqa=True)
            do4 = do.view(b, n, h, d).transpose(1, 2)
            sdpa_bwd_ms = float(do_bench(lambda: torch.autograd.grad(o4, (ql, kl, vl), do4, retain_graph=True)))
            ref = at.attention_bwd(q, k, v, ref_out, ref_lse, do, cu, cu, scale, plan)
            line = [f"B{b} L{n} backward: sdpa flash {2.5 * flops / sdpa_bwd_ms / 1e9:6.1f} TF/s"]
            for cfg in args.bwd_configs.split(","):
                kv_cfg, q_cfg = cfg.split("/")
                tma = kv_cfg.endswith("t")  # the dK/dV kernel's complete query blocks through TMA
                kw = {"dkdv_launch": _launch(kv_cfg.removesuffix("t")), "dq_launch": _launch(q_cfg), "dkdv_tma": tma}
                try:
                    grads = at.attention_bwd(q, k, v, ref_out, ref_lse, do, cu, cu, scale, plan, **kw)
                    same = all(torch.equal(x.view(torch.int16), y.view(torch.int16)) for x, y in zip(grads, ref))
                    ms = float(do_bench(lambda kw=kw: at.attention_bwd(q, k, v, ref_out, ref_lse, do, cu, cu, scale,
                                                                       plan, **kw)))
                    rows.append({"B": b, "L": n, "bwd_config": cfg, "ms": ms, "sdpa_ms": sdpa_bwd_ms,
                                 "ratio": sdpa_bwd_ms / ms, "bits_equal": bool(same)})
                    line.append(f"{cfg}={sdpa_bwd_ms / ms:.2f}{'' if same else '!BITS'}")
                except Exception as exc:
                    rows.append({"B": b, "L": n, "bwd_config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
                    line.append(f"{cfg}=err")
            print(" ".join(line), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"tool": "tools/attention_prefill_sweep.py", "argv": sys.argv[1:],
                   "device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    return 1 if any(r.get("bits_equal") is False for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
