"""Time the rms_norm dweight stage 2 (``dw_reduce``) at the Qwen3-8B train step's shapes over
columns per program, on a GPU.

Shapes (partial rows x columns): the QK-norm weights of 4 x 1024 and 8 x 1024 tokens (32 query
heads of D = 128: 2048 and 4096 partial rows of 64 head rows) and a hidden-size norm (64 and 128
partial rows of 4096 columns). Every block's output must equal the default launch's bits (each
column's rows are added in the same order whatever the block). Usage::

    python tools/rms_dw_reduce_sweep.py --blocks 256,128,64,32,16 --out rms_dw_reduce_sweep.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", default="256,128,64,32,16")
    p.add_argument("--shapes", default="2048x128,4096x128,64x4096,128x4096")
    p.add_argument("--out", default="rms_dw_reduce_sweep.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from triton.testing import do_bench

    from rl_engine.ops.rms_norm import triton as rn

    rows = []
    g = torch.Generator(device="cuda").manual_seed(5)
    for shape in args.shapes.split(","):
        n_parts, cols = (int(x) for x in shape.split("x"))
        parts = torch.randn((n_parts, cols), generator=g, device="cuda")
        ref = rn.dw_reduce(parts, torch.empty(cols, dtype=torch.bfloat16, device="cuda"))
        line = [f"{shape}:"]
        for block in [None, *(int(b) for b in args.blocks.split(","))]:
            out = torch.empty(cols, dtype=torch.bfloat16, device="cuda")
            same = torch.equal(rn.dw_reduce(parts, out, block).view(torch.int16), ref.view(torch.int16))
            us = 1e3 * float(do_bench(lambda block=block, out=out: rn.dw_reduce(parts, out, block)))
            rows.append({"parts": n_parts, "cols": cols, "block": block, "us": us, "bits_equal": bool(same)})
            line.append(f"{block or 'default'}={us:.1f}us{'' if same else '!BITS'}")
        print(" ".join(line), flush=True)
    with open(args.out, "w") as fh:
        json.dump({"tool": "tools/rms_dw_reduce_sweep.py", "argv": sys.argv[1:],
                   "device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)
    return 1 if any(not r["bits_equal"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
