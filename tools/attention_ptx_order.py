"""Which arithmetic the Triton attention forward compiles to on sm_90, read from its PTX (no GPU).

Compiles ``_attn_fwd_kernel`` (Qwen3-8B launch: D = 128, GQA 4, 64 x 64 tiles, 4 warps, 2 stages,
``enable_fp_fusion=False``, the launcher's 16-divisibility of pointers and strides) for an sm_90
target with the installed Triton and prints:

* the MMA instructions and how often each appears (``wgmma`` m64n64k16 for ``q k^T``, m64n128k16
  for ``P V``, or ``mma.sync`` for small tiles),
* the exponential (``ex2.approx.f32`` of ``x * log2 e`` is ``tl.exp``),
* shared-memory traffic (a layout conversion would add some),
* the order in which one thread adds its probabilities of one row into the block's row sum ``l``
  (the first ``tl.sum`` of the first KV loop): each ``p`` is named by its index in the thread's
  accumulator fragment (``e0`` .. ``e31``; ``e[4 j]``, ``e[4 j + 1]`` are row ``g``'s columns
  ``8 j + 2 t``, ``+ 1``), then the quad butterfly offsets.

This is what a CUDA kernel must reproduce to give the Triton backend's attention bits, and it
changes with the Triton version (Triton 3.6: a left fold in fragment order; 3.9: a pairwise tree),
so compare the two on the Triton the H200 runs; ``--pinned`` compiles the fixed order of
``fragment_row_sum`` (``ROW_SUM_PINNED``), which both versions compile to 3.9's instructions. Run a second Triton without touching the
environment by putting its wheel's files first on the path::

    pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36 python tools/attention_ptx_order.py
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter


def compile_ptx(pinned: bool = False) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from rl_engine.ops._triton_common import FP_FUSION
    from rl_engine.ops.attention import triton as at

    strides = ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh", "stride_ot", "stride_oh")
    sig = {**{n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}, "lse_ptr": "*fp32", "cu_q_ptr": "*i32",
           "cu_k_ptr": "*i32", "n_mblocks": "i32", "n_heads": "i32", **{n: "i32" for n in strides},
           "stride_lh": "i32", "scale": "fp32"}
    consts = {"GROUP": 4, "D": 128, "UPCAST": False, "BLOCK_M": at.BLOCK_M, "BLOCK_N": at.BLOCK_N,
              "PINNED_SUM": pinned}
    sig.update({name: "constexpr" for name in consts})
    names = list(sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n.endswith("_ptr") or n in strides}
    src = ASTSource(fn=at._attn_fwd_kernel, signature=sig, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": at.NUM_WARPS, "num_stages": at.NUM_STAGES,
                                     "enable_fp_fusion": FP_FUSION})
    return kernel.asm["ptx"]


def first_row_sum(ptx: str) -> tuple[list[str], list[str]]:
    """The first block's ``l`` row sums of one thread (the two rows' expressions in fragment names)
    and the butterfly offsets that follow, in order. The fragment order of the p registers is read
    from the BF16 packing of P for the ``P V`` product that follows (``cvt.rn.bf16x2.f32 d, hi, lo``:
    lo is element 2 i, hi element 2 i + 1), which is the order of the accumulator fragment."""
    lines = ptx.splitlines()
    out_of = {i: re.search(r"ex2\.approx\.f32\s+(%r\d+)", line).group(1)
              for i, line in enumerate(lines) if "ex2.approx.f32" in line}
    # alpha = where(m_new == m, 1, exp(...)): the ex2 results selected against 1.0 are not p's
    alphas = set(re.findall(r"selp\.f32\s+%r\d+, 0f3F800000, (%r\d+)", ptx))
    first_p = min(i for i, reg in out_of.items() if reg not in alphas)
    cvt = [i for i in range(first_p, len(lines)) if "cvt.rn.bf16x2.f32" in lines[i]][:16]
    names = {}
    for j, i in enumerate(cvt):
        hi, lo = re.search(r"cvt\.rn\.bf16x2\.f32\s+%r\d+, (%r\d+), (%r\d+)", lines[i]).groups()
        names[lo], names[hi] = f"e{2 * j}", f"e{2 * j + 1}"
    shuffles = []
    for line in lines[first_p:cvt[0]]:
        m = re.search(r"add\.rn\.f32\s+(%r\d+), (%r\d+), (%r\d+)", line)
        sh = re.search(r"shfl\.sync\.bfly\.b32\s+(%r\d+), (%r\d+), (\d+)", line)
        if m:
            out, a, b = m.groups()
            if a in names or b in names:
                names[out] = f"({names.get(a, a)} + {names.get(b, b)})"
        elif sh:
            out, src, off = sh.groups()
            shuffles.append(off)
            names[out] = f"bfly{off}[{names.get(src, src)}]"
    full = [v for v in names.values() if v.startswith("(") and "bfly" not in v and len(re.findall(r"e\d+", v)) == 16]
    return full, shuffles


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ptx", default=None, help="also write the PTX to this file")
    p.add_argument("--pinned", action="store_true", help="the row sum in fragment_row_sum's fixed order (PINNED_SUM)")
    args = p.parse_args(argv)
    import triton

    ptx = compile_ptx(args.pinned)
    if args.ptx:
        with open(args.ptx, "w") as fh:
            fh.write(ptx)
    print(f"triton {triton.__version__}, sm_90, _attn_fwd_kernel (D 128, 64 x 64 tiles, PINNED_SUM={args.pinned})")
    print(f"  shared-memory stores / loads, barriers: {ptx.count('st.shared')} / {ptx.count('ld.shared')}, "
          f"{ptx.count('bar.sync')}")
    mma = Counter(re.findall(r"(wgmma\.mma_async\.sync\.aligned\.m\d+n\d+k\d+|mma\.sync\.aligned\.m\d+n\d+k\d+)", ptx))
    for name, n in sorted(mma.items()):
        print(f"  {n:3d} x {name}")
    exp = Counter(re.findall(r"(ex2\.approx[.a-z0-9]*|lg2\.approx[.a-z0-9]*|div\.rn\.f32|div\.full\.f32)", ptx))
    print("  " + ", ".join(f"{k} x {v}" for k, v in sorted(exp.items())))
    print(f"  log2 e multiplier before ex2: {'0f3FB8AA3B' in ptx}; libdevice logf: {'__nv_logf' in ptx}")
    sums, shuffles = first_row_sum(ptx)
    print("  one thread's row sums of p (first KV block), in the order added:")
    for s in sums:
        print(f"    {s}")
    print(f"  then butterfly offsets {', '.join(shuffles)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
