"""Sweep the warps of the Triton RMSNorm forward at decode row counts on a GPU (issue #19).

A decode step at B = 1 runs 73 one-row norms of E = 4096 (two per layer, with the residual add
fused in, and the final norm). For T in {1, 16, 64} rows, the plain and the add-fused forward are
launched with each warp count; each output (and the add's sum) is compared bit for bit with the
module's default launch and timed as in a captured step (``CALLS`` launches in one CUDA graph,
replayed ``REPLAYS`` times). Prints one line per (T, form, warps) and writes ``--json``.

Usage: ``python tools/rms_decode_sweep.py [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import triton

from rl_engine.graphs import time_per_call
from rl_engine.ops.rms_norm import triton as rt

E, EPS = 4096, 1e-6
WARPS = (1, 2, 4, 8, 16)
CALLS, REPLAYS = 50, 5


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "rms_decode_sweep.json"))
    args = ap.parse_args()
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(5)
    w = (1 + 0.1 * torch.randn((E,), generator=g, device=dev)).to(torch.bfloat16)
    rows = []
    for t in (1, 16, 64):
        x = torch.randn((t, E), generator=g, device=dev).to(torch.bfloat16)
        d = torch.randn((t, E), generator=g, device=dev).to(torch.bfloat16)
        forms = {
            "plain": lambda nw, x=x: rt.rms_norm_fwd(x, w, EPS, True, num_warps=nw)[:1],
            "add": lambda nw, x=x, d=d: rt.add_rms_norm_fwd(x, d, w, EPS, True, num_warps=nw),
        }
        for form, fn in forms.items():
            ref = [r.view(torch.int16).clone() for r in fn(0)]
            for nw in WARPS:
                same = all(torch.equal(a.view(torch.int16), b) for a, b in zip(fn(nw), ref))
                us = time_per_call(lambda nw=nw, fn=fn: fn(nw), CALLS, REPLAYS) * 1e3
                rows.append({"T": t, "form": form, "num_warps": nw, "us": us, "same_bits": same})
                print(f"T={t:2d} {form:5s} {nw:2d} warps: {us:6.2f} us per launch, same bits {same}")
    with open(args.json, "w") as f:
        json.dump({"E": E, "rows": rows, "torch": torch.__version__, "triton": triton.__version__,
                   "device": torch.cuda.get_device_name(), "default_warps": rt._warps(rt._block(E))}, f, indent=1)
    return 0 if all(r["same_bits"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
