"""Time the cuda_bf16 linear_logp forward's row blocks on a GPU (``linear_logp.cuda.FWD_ROW_BLOCK``).

Qwen3-8B head shapes (E = 4096, V = 151936), T tokens. For each row block (``all`` = one pass) the
forward's logprobs, row max and log sum-exp must equal the one-pass bits; times with
``triton.testing.do_bench``. The logits chunk of a block of R rows is R x 4096 FP32 (2048 rows: 32 MiB),
so a block small enough to stay in L2 lets the partial kernel read it from there. Usage::

    python tools/cuda_linear_logp_rows.py --tokens 8192 --blocks all,4096,2048,1024 --out rows.json
"""

from __future__ import annotations

import argparse
import json

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="8192")
    p.add_argument("--blocks", default="all,4096,2048,1536,1024")
    p.add_argument("--rep-ms", type=int, default=200)
    p.add_argument("--out", default="cuda_linear_logp_rows.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from triton.testing import do_bench

    from rl_engine.ops.linear_logp import cuda as ll
    from rl_engine.ops.logp import declared

    if not declared.DECLARED_LSE:
        raise SystemExit("FWD_ROW_BLOCK applies to the declared forward (logp.declared.DECLARED_LSE)")
    e, v = 4096, 151936
    g = torch.Generator(device="cuda").manual_seed(7)
    w = (torch.randn((v, e), generator=g, device="cuda") * e ** -0.5).to(torch.bfloat16)
    rows = []
    for t in (int(x) for x in args.tokens.split(",")):
        h = torch.randn((t, e), generator=g, device="cuda").to(torch.bfloat16)
        tg = torch.randint(0, v, (t,), generator=g, device="cuda")
        ref = None
        for b in args.blocks.split(","):
            ll.FWD_ROW_BLOCK = None if b == "all" else int(b)
            res = ll.linear_logp_fwd(h, w, tg, 1.0)
            torch.cuda.synchronize()
            ref = res if ref is None else ref
            same = all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(res, ref))
            ms = do_bench(lambda: ll.linear_logp_fwd(h, w, tg, 1.0), rep=args.rep_ms)
            row = {"tokens": t, "row_block": b, "ms": ms, "same_bits_as_first": same}
            rows.append(row)
            print(json.dumps(row), flush=True)
    ll.FWD_ROW_BLOCK = None
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "gpu": torch.cuda.get_device_name()}, f, indent=1)
    return 0 if all(r["same_bits_as_first"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
