"""Sweep the persistent TMA form of the Triton det_gemm on a GPU (issue #33): bits and speed.

For each Qwen3-8B projection shape at training sizes, and for each of the three products of a
training step as the model lays them out (``forward = x @ W^T`` with ``b = W.t()``, ``dx = dy @ W``,
``dW = dy^T @ x`` with ``a = dy.t()``, as the op's backward computes the weight gradient), this times

- the fused form (one program per tile, the four leaf loops one after another),
- the persistent form in each configuration of ``--configs``,
- ``torch.matmul`` on the same operand views (cuBLAS),

with ``triton.testing.do_bench`` (L2 flushed per call), and checks that every configuration gives
the fused form's bits (a configuration that does not is reported and never chosen). Writes a JSON
document (``--out``) with one row per (shape, product, implementation) and prints a table of the
ratios to cuBLAS. Usage on the H200::

    python tools/det_gemm_prefill_sweep.py --out sweep.json
    python tools/det_gemm_prefill_sweep.py --ms 1024,8192 --configs 128x128x8x4x8x2r,128x256x8x3x8x2r

``--cuda-forms 0,1,2,3,4,4n,5`` adds the ``cuda_bf16`` det_gemm in those forms of its training-size GEMMs
(:data:`rl_engine.ops.det_gemm.cuda.TREE_GEMM_FORMS`: 0 the WMMA kernel, 1 and 2 the pipelined
mma.sync kernel in 128 x 128 and 128 x 256 tiles, 3 wgmma for the three training products, 4 the same
warp-specialised and persistent, 4n with one block per tile, 5 form 4 with TMA copies, 6 form 5 in 128 x 256 tiles,
7 form 5 with the depth-2 trees' sibling leaves side by side, 5n, 6n, 7n) as ``cuda0`` .. ``cuda7n``, with their bits
against the Triton fused form (the two backends give the same det_gemm bits).

A configuration is ``BMxBNxWARPSxSTAGESxGROUPx<LOOP><PARK>[xBK]`` (LOOP: the kernel's loop
structure, 4 all leaves of a tile side by side, 3 two sibling leaves side by side, 2 one loop over
every block, 1 the compiler's flattening, 0 the nest; PARK: ``r`` pending leaves in registers,
``m`` in memory, ``w`` in registers with the item loop warp-specialised, ``f`` in registers with
the item and block loops fused into one pipelined loop; then optionally ``t`` /
``s``: tiles stored through a TMA descriptor whole / in two column halves (loop 3); BK: the K step,
default 64; ``PersistentTiles``), e.g. ``128x128x8x3x8x0rx128``, ``128x128x8x3x8x3rs``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

SHAPES = {"q_o": (4096, 4096), "kv": (4096, 1024), "gate_up": (4096, 12288), "down": (12288, 4096)}
"""name -> (K, N) of the forward product x [M, K] @ W^T, W [N, K]."""
DEFAULT_CONFIGS = ("128x128x8x4x8x0r", "128x128x8x3x8x0r", "128x128x8x5x8x0r", "128x128x8x4x4x0r",
                   "128x128x8x4x16x0r", "128x128x8x4x8x0m")
"""The sweep's configurations (``LOOP = 1`` is left out: it does not compile on Triton 3.6)."""


def parse_config(text: str):
    from rl_engine.ops.det_gemm.triton import PersistentTiles

    fields = text.split("x")
    if len(fields) not in (6, 7):
        raise SystemExit(f"config {text!r}: expected BMxBNxWARPSxSTAGESxGROUPx<LOOP><PARK>[xBK]")
    bm, bn, warps, stages, group, last = fields[:6]
    if len(last) not in (2, 3) or last[0] not in "01234" or last[1] not in "rmwf" or last[2:] not in ("", "t", "s"):
        raise SystemExit(f"config {text!r}: the sixth field is LOOP (0-4), then r, m, w or f (parking), then "
                         f"optionally t or s (TMA store)")
    bk = int(fields[6]) if len(fields) == 7 else PersistentTiles.bk
    try:
        return PersistentTiles(int(bm), int(bn), int(warps), int(stages), int(group), int(last[0]), last[1] != "m", bk,
                               ws=last[1] == "w", flat=last[1] == "f", c_split={"": 0, "t": 1, "s": 2}[last[2:]])
    except ValueError as exc:
        raise SystemExit(f"config {text!r}: {exc}") from exc


def products(m: int, k: int, n: int, g: torch.Generator):
    w = (torch.randn((n, k), generator=g, device="cuda") * k ** -0.5).to(torch.bfloat16)
    x = torch.randn((m, k), generator=g, device="cuda").to(torch.bfloat16)
    dy = torch.randn((m, n), generator=g, device="cuda").to(torch.bfloat16)
    return {"forward": (x, w.t()), "dx": (dy, w), "dw": (dy.t(), x)}


class CudaForms:
    """The cuda_bf16 det_gemm in a given training-size form, fused or leaf-parallel as the op itself
    chooses for the output's size (what the chain runs); the library's process-wide form is only
    switched when it changes, so a timed call is the op's launches only."""

    def __init__(self) -> None:
        from rl_engine.ops.det_gemm import cuda as dg_cuda

        self.dg = dg_cuda
        self.form: int | None = None

    def call(self, form: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if form != self.form:  # "4n": form 4 with one block per tile instead of its persistent grid
            self.dg.set_tree_gemm_form(int(form.rstrip("n")))
            self.dg.set_tree_wgmma_ws_persistent(0 if form.endswith("n") else 1)
            self.form = form
        return self.dg.det_gemm_launch(a, b, 2)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ms", default="1024,4096,8192", help="token counts M (comma-separated)")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {list(SHAPES)}")
    p.add_argument("--products", default="forward,dx,dw")
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    p.add_argument("--rep-ms", type=float, default=60.0)
    p.add_argument("--rounds", type=int, default=1,
                   help="times each implementation this many times, round-robin, and reports the median")
    p.add_argument("--cuda-forms", default="",
                   help="also the cuda_bf16 det_gemm in these forms of TREE_GEMM_FORMS (comma-separated, e.g. 0,1)")
    p.add_argument("--out", default="det_gemm_prefill_sweep.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    from triton.testing import do_bench

    from rl_engine.ops.det_gemm import triton as dg

    configs = {c: parse_config(c) for c in args.configs.split(",") if c}
    cuda_forms = [f for f in args.cuda_forms.split(",") if f]
    for f in cuda_forms:
        if not (f.isdigit() or f in ("4n", "5n", "6n")):
            raise SystemExit(f"--cuda-forms: {f!r}: a form number (4n, 5n, 6n: form 4, 5 or 6, one block per tile)")
    cuda = CudaForms() if cuda_forms else None
    rows = []
    t_start = time.time()

    def write():  # after every product, so a run cut short keeps what it measured
        doc = {"tool": "tools/det_gemm_prefill_sweep.py", "argv": sys.argv[1:], "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "triton": __import__("triton").__version__,
               "seconds": round(time.time() - t_start, 1), "rows": rows}
        with open(args.out, "w") as fh:
            json.dump(doc, fh, indent=1)

    def timed(fn):
        return float(do_bench(fn, warmup=20, rep=args.rep_ms))

    for m in (int(x) for x in args.ms.split(",")):
        for shape in args.shapes.split(","):
            k, n = SHAPES[shape]
            g = torch.Generator(device="cuda").manual_seed(m * 7 + k + n)
            for prod, (a, b) in products(m, k, n, g).items():
                if prod not in args.products.split(","):
                    continue
                mm, kk = a.shape
                nn = b.shape[1]
                flops = 2 * mm * nn * kk
                ref = dg.det_gemm_launch(a, b, 2, False, leaf_split=False, persistent=False)
                base = {"M": m, "shape": shape, "product": prod, "dims": [mm, kk, nn], "flops": flops}
                # every implementation is run and checked once, then timed round-robin: each round
                # times each of them once, so a slow drift of the clocks reaches all of them alike
                impls = {"cublas": (lambda: a @ b, None),
                         "fused": (lambda: dg.det_gemm_launch(a, b, 2, False, leaf_split=False, persistent=False), True),
                         "default": (lambda: dg.det_gemm_launch(a, b, 2, False), None)}
                for name, cfg in configs.items():
                    impls[name] = (lambda cfg=cfg: dg.det_gemm_launch(a, b, 2, False, persistent=True,
                                                                      persistent_tiles=cfg), None)
                for form in cuda_forms:
                    impls[f"cuda{form}"] = (lambda form=form: cuda.call(form, a, b), None)
                errors, bits = {}, {}
                for name, (fn, known) in impls.items():
                    try:
                        out = fn()
                        bits[name] = None if name == "cublas" else (
                            known if known is not None else bool(torch.equal(out.view(torch.int16), ref.view(torch.int16))))
                    except Exception as exc:  # a configuration that does not compile (shared memory)
                        errors[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
                times: dict[str, list[float]] = {name: [] for name in impls if name not in errors}
                for _ in range(args.rounds):
                    for name in times:
                        times[name].append(timed(impls[name][0]))
                for name in impls:
                    if name in errors:
                        rows.append({**base, "impl": name, "ms": None, "bits_equal": None, "error": errors[name]})
                    else:
                        ts = sorted(times[name])
                        rows.append({**base, "impl": name, "ms": statistics.median(ts), "ms_min": ts[0], "ms_max": ts[-1],
                                     "rounds": len(ts), "bits_equal": bits[name]})
                cublas_ms = next(r["ms"] for r in rows if r["impl"] == "cublas" and
                                 (r["M"], r["shape"], r["product"]) == (m, shape, prod))
                line = [f"M{m:5d} {shape:8s} {prod:8s} cuBLAS {flops / cublas_ms / 1e9:6.1f} TF/s"]
                for r in rows:
                    if (r["M"], r["shape"], r["product"]) == (m, shape, prod) and r["impl"] != "cublas":
                        ratio = "err" if r["ms"] is None else f"{cublas_ms / r['ms']:.2f}"
                        flag = "" if r["bits_equal"] in (True, None) else "!BITS"
                        line.append(f"{r['impl']}={ratio}{flag}")
                print(" ".join(line), flush=True)
                write()
    write()
    bad = [r for r in rows if r["bits_equal"] is False]
    print(f"{len(rows)} rows, {len(bad)} with different bits -> {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
