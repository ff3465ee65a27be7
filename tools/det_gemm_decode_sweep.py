"""Sweep the leaf-parallel det_gemm tiles for decode-sized M on a GPU (issue #19).

For every Qwen3-8B projection shape (and the fused q/k/v and gate/up widths) and M in ``--ms``
(default {1, 16}; M > 16 sweeps 32- and 64-row tiles and the prefill tiles),
each candidate :class:`rl_engine.ops.det_gemm.triton.LeafTiles` is launched, its output compared
bit for bit with the fused prefill form (128 x 128 tiles), and timed next to ``torch.matmul``
(cuBLAS) on the same operands and a device-to-device copy of 1 GiB, all in the same process.
Timing is what a captured decode step sees: ``CALLS`` launches back to back captured in one CUDA
graph, the graph replayed ``REPLAYS`` times between CUDA events (no host overhead per call; the
weight, 8-200 MB, is re-read every call, and L2 (50 MB) holds at most part of it). Prints one line per (shape, M, config)
and writes ``--json`` (default ``$OUT/det_gemm_decode_sweep.json``).

Bandwidth counts the bytes a GEMV must move: the weight, the activations and the output (BF16).

Usage: ``python tools/det_gemm_decode_sweep.py [--quick] [--ms 1,16] [--json PATH]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch
import triton.testing

from rl_engine.ops.det_gemm import triton as dg

SHAPES = {"q_proj/o_proj": (4096, 4096), "kv_proj": (4096, 1024), "gate/up_proj": (4096, 12288),
          "down_proj": (12288, 4096), "qkv_fused": (4096, 6144), "gate_up_fused": (4096, 24576)}


CALLS, REPLAYS = 20, 5


def _gbps(nbytes: int, ms: float) -> float:
    return nbytes / ms / 1e6


def graph_ms(fn) -> float:
    """ms per call of ``fn``: CALLS calls captured in one CUDA graph, replayed REPLAYS times."""
    from rl_engine.graphs import time_per_call

    return time_per_call(fn, CALLS, REPLAYS)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "det_gemm_decode_sweep.json"))
    ap.add_argument("--ms", default="1,16", help="comma-separated M values (rows of the activation)")
    args = ap.parse_args()
    m_values = tuple(int(x) for x in args.ms.split(","))
    dev = torch.device("cuda")
    src = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=100)
    copy = _gbps(2 * src.numel(), copy_ms)
    del src, dst
    print(f"copy bandwidth {copy:.0f} GB/s")
    bns = (32, 64) if args.quick else (16, 32, 64, 128)
    warps = (4,) if args.quick else (2, 4, 8)
    stages = (4,) if args.quick else (3, 4, 6)
    def configs_for(m: int) -> list:
        if m <= 16:
            return [dg.LeafTiles(16, bn, w, st) for bn, w, st in itertools.product(bns, warps, stages)]
        # M above the 16-row decode tiles (a batch of 32 or 64 sequences): 32- and 64-row tiles
        return [dg.LeafTiles(bm, bn, w, st) for bm, bn, w, st in
                itertools.product((32, 64), (32, 64, 128), (4, 8), (3, 4))] + [dg.PREFILL_TILES]
    rows = []
    t0 = time.time()
    for name, (k, n) in SHAPES.items():
        g = torch.Generator(device=dev).manual_seed(k * 31 + n)
        w = (torch.randn((n, k), generator=g, device=dev) * k ** -0.5).to(torch.bfloat16)
        for m in m_values:
            a = torch.randn((m, k), generator=g, device=dev).to(torch.bfloat16)
            ref = dg.det_gemm_launch(a, w.t(), 2, False, leaf_split=False)
            nbytes = 2 * (n * k + m * k + m * n)
            cublas_ms = graph_ms(lambda: a @ w.t())
            cur = dg.det_gemm_launch(a, w.t(), 2, False)  # what the launcher picks today
            cur_ms = graph_ms(lambda: dg.det_gemm_launch(a, w.t(), 2, False))
            print(f"{name} M={m}: cuBLAS {cublas_ms * 1e3:.1f} us ({_gbps(nbytes, cublas_ms):.0f} GB/s); "
                  f"launcher default {cur_ms * 1e3:.1f} us ({_gbps(nbytes, cur_ms):.0f} GB/s) "
                  f"same bits {torch.equal(cur.view(torch.int16), ref.view(torch.int16))}")
            for cfg in configs_for(m):
                try:
                    out = dg.det_gemm_launch(a, w.t(), 2, False, leaf_split=True, tiles=cfg)
                    same = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
                    ms = graph_ms(lambda: dg.det_gemm_launch(a, w.t(), 2, False, leaf_split=True, tiles=cfg))
                    err = None
                except Exception as exc:  # a config that does not compile is a row, not the end
                    same, ms, err = None, None, f"{type(exc).__name__}: {str(exc)[:200]}"
                row = {"shape": name, "M_group": "le16" if m <= 16 else "gt16", "K": k, "N": n, "M": m, "tiles": cfg.__dict__, "same_bits": same, "us": None
                       if ms is None else ms * 1e3, "gbps": None if ms is None else _gbps(nbytes, ms),
                       "cublas_us": cublas_ms * 1e3, "cublas_gbps": _gbps(nbytes, cublas_ms),
                       "vs_cublas": None if ms is None else cublas_ms / ms, "copy_gbps": copy, "error": err}
                rows.append(row)
                print(f"  {cfg.bn:3d}x{cfg.num_warps}w x{cfg.num_stages}s: "
                      + (err or f"{ms * 1e3:7.1f} us {row['gbps']:5.0f} GB/s = {row['vs_cublas']:.2f}x cuBLAS, "
                                f"{row['gbps'] / copy:.2f} of copy, same bits {same}"))
    # the config with the best geometric mean speed over all (shape, M), among those with the same bits everywhere
    by_cfg: dict[tuple, list[dict]] = {}
    for r in rows:
        by_cfg.setdefault((r["M_group"], *r["tiles"].values()), []).append(r)
    scores = {}
    for key, rs in by_cfg.items():
        if all(r["same_bits"] for r in rs):
            prod = 1.0
            for r in rs:
                prod *= r["vs_cublas"]
            scores[key] = prod ** (1 / len(rs))
    best = {}
    for grp in sorted({r["M_group"] for r in rows}):
        cand = {k: v for k, v in scores.items() if k[0] == grp}
        best[grp] = max(cand, key=cand.get) if cand else None
        print(f"best config for M {grp} (geo-mean vs cuBLAS over shapes x M): {best[grp]} -> {cand.get(best[grp])}")
    if any(r["same_bits"] is False for r in rows):
        print("CONFIGS WITH OTHER BITS:", sorted({(r['M'], *r['tiles'].values()) for r in rows if r['same_bits'] is False}))
    with open(args.json, "w") as f:
        json.dump({"copy_gbps": copy, "rows": rows, "best": best, "scores": {str(k): v for k, v in scores.items()},
                   "wall_s": time.time() - t0, "torch": torch.__version__, "triton": triton.__version__,
                   "device": torch.cuda.get_device_name()}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
