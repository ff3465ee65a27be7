"""Sweep the decode-attention launch on a GPU (issue #19): Triton's head-dim split, warps and
stages, or with ``--backend cuda`` the CUDA backend's forms: the two launches at each column split of
the second launch, and the one-pass kernel at each ring depth (printed as its stages).

For B in {1, 16, 64} x context in {1024, 8192} at Qwen3-8B head shapes (32 query heads over 8 KV
heads, D = 128; a static cache of exactly ``context`` positions, every sequence at full length), each
configuration's output is compared bit for bit with the unsplit launch (``d_split = 1``, the module's
warps and stages; for cuda the two launches at split 1) and timed as it runs in a captured decode step: ``CALLS`` launches back to back in
one CUDA graph, replayed ``REPLAYS`` times between CUDA events. A 1 GiB device copy in the same
process gives the bandwidth the KV read is measured against (bytes = the K and V of every
sequence, read once). Prints one line per (shape, config) and writes ``--json`` (default
``$OUT/attention_decode_sweep.json``).

Usage: ``python tools/attention_decode_sweep.py [--backend triton|cuda] [--quick] [--json PATH]``;
``--once B:CONTEXT`` launches the default decode twice at one shape, untimed, for ``ncu``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch
import triton
import triton.testing

from rl_engine.graphs import time_per_call
from rl_engine.ops.attention import cuda as at_cuda
from rl_engine.ops.attention import triton as at_triton

H, HKV, D = 32, 8, 128
CALLS, REPLAYS = 20, 5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--backend", choices=("triton", "cuda"), default="triton")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "attention_decode_sweep.json"))
    ap.add_argument("--once", metavar="B:CONTEXT", default=None,
                    help="launch the default decode twice at one shape (a warm-up, then the one to profile), untimed, for ncu, and stop")
    args = ap.parse_args()
    dev = torch.device("cuda")
    if args.once:
        bsz, ctx = (int(v) for v in args.once.split(":"))
        at = at_cuda if args.backend == "cuda" else at_triton
        kc, vc = (torch.randn((bsz, ctx, HKV, D), device=dev).to(torch.bfloat16) for _ in range(2))
        q = torch.randn((bsz, H, D), device=dev).to(torch.bfloat16)
        lens = torch.full((bsz,), ctx, dtype=torch.int32, device=dev)
        for _ in range(2):  # a warm-up launch, then the profiled one
            at.attention_decode_fwd(q, kc, vc, lens, D ** -0.5)
        torch.cuda.synchronize()
        return 0
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100) / 1e6
    del src, dst
    print(f"copy bandwidth {copy:.0f} GB/s")
    splits = (1, 4) if args.quick else (1, 2, 4, 8)
    if args.backend == "cuda":  # the launch constants are compiled in; the form and column split vary
        at, configs = at_cuda, [(s, None, None) for s in splits] + [("one_pass", None, st) for st in at_cuda.ONE_PASS_STAGES]
    else:
        stages = (2,) if args.quick else (2, 3)
        warps = (4,) if args.quick else (4, 8)
        at, configs = at_triton, list(itertools.product(splits, warps, stages))
    rows = []
    t0 = time.time()
    for bsz, ctx in itertools.product((1, 16, 64), (1024, 8192)):
        g = torch.Generator(device=dev).manual_seed(bsz * 7 + ctx)
        kc = torch.randn((bsz, ctx, HKV, D), generator=g, device=dev).to(torch.bfloat16)
        vc = torch.randn((bsz, ctx, HKV, D), generator=g, device=dev).to(torch.bfloat16)
        q = torch.randn((bsz, H, D), generator=g, device=dev).to(torch.bfloat16)
        lens = torch.full((bsz,), ctx, dtype=torch.int32, device=dev)
        scale = D ** -0.5
        nbytes = 2 * kc.numel() * 2
        unsplit = {"form": "two_launch"} if args.backend == "cuda" else {}
        ref = at.attention_decode_fwd(q, kc, vc, lens, scale, d_split=1, **unsplit)
        default_ms = time_per_call(lambda: at.attention_decode_fwd(q, kc, vc, lens, scale), CALLS, REPLAYS)
        print(f"B={bsz} ctx={ctx}: KV {nbytes / 1e6:.0f} MB; launcher default "
              f"{default_ms * 1e3:.1f} us = {nbytes / default_ms / 1e6 / copy:.2f} of copy")
        for split, w, st in configs:
            def call(split=split, w=w, st=st):
                if split == "one_pass":  # num_stages: the one-pass form's ring depth
                    old = at.set_one_pass_stages(st)
                    try:
                        return at.attention_decode_fwd(q, kc, vc, lens, scale, form="one_pass")
                    finally:
                        at.set_one_pass_stages(old)
                if w is None:
                    return at.attention_decode_fwd(q, kc, vc, lens, scale, d_split=split, form="two_launch")
                return at.attention_decode_fwd(q, kc, vc, lens, scale, d_split=split, num_warps=w, num_stages=st)
            try:
                same = bool(torch.equal(call().view(torch.int16), ref.view(torch.int16)))
                ms, err = time_per_call(call, CALLS, REPLAYS), None
            except Exception as exc:  # a configuration that does not compile is a row, not the end
                same, ms, err = None, None, f"{type(exc).__name__}: {str(exc)[:200]}"
            frac = None if ms is None else nbytes / ms / 1e6 / copy
            rows.append({"B": bsz, "context": ctx, "d_split": split, "num_warps": w, "num_stages": st,
                         "same_bits": same, "us": None if ms is None else ms * 1e3, "of_copy": frac,
                         "kv_bytes": nbytes, "copy_gbps": copy, "error": err})
            print(f"  split {split} {w or '-'}w {st or '-'}s: " + (err or f"{ms * 1e3:8.1f} us {frac:.2f} of copy, same bits {same}"))
        del kc, vc
    bad = sorted({(str(r["d_split"]), r["num_warps"] or 0, r["num_stages"] or 0) for r in rows if r["same_bits"] is False})
    if bad:
        print("CONFIGS WITH OTHER BITS:", bad)
    with open(args.json, "w") as f:
        json.dump({"backend": args.backend, "copy_gbps": copy, "rows": rows, "other_bits": bad, "wall_s": time.time() - t0,
                   "torch": torch.__version__, "triton": triton.__version__,
                   "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
