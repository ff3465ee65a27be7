"""How each thread adds its values in a Triton kernel's first butterfly-reduced sum, read from the
sm_90 PTX of the installed Triton (no GPU needed).

For each kernel case of ``tests/ops/test_sm90_compile.py`` named on the command line (compiled as
the package launches them, ``enable_fp_fusion=False``), it finds the first ``shfl.sync.bfly`` with the
given offset and expands the ``add.rn.f32`` tree that feeds it back to its leaves, printing the tree's
shape: ``left fold`` ``(((a + b) + c) + d)``, ``right fold`` ``(a + (b + (c + d)))``, ``balanced
tree`` or the expression itself. Run it under two Tritons to see whether a kernel's sum order (and so
its bits) depends on the version (docs/declared-arithmetic.md, "Sums whose order is the Triton
compiler's")::

    python tools/triton_sum_order.py "linear_logp_fwd_partial[True,128]" "linear_logp_fwd_partial[True,128,pinned]"
    PYTHONPATH=/tmp/t36 python tools/triton_sum_order.py ...   # pip install --no-deps --target /tmp/t36 triton==3.6.0
    python tools/triton_sum_order.py --offset 8 "attention_bwd_delta[128]" "attention_bwd_delta[128,pinned]"

The first butterfly offset of the sums: 2 for a wgmma accumulator's row (a quad), 8 for the
attention backward's delta at D = 128, 16 for a 32-lane row.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kernel_cases():
    """The ``cases()`` generator of the sm_90 compile test's script, with ``compile_`` returning the
    compiled kernel."""
    sys.path.insert(0, str(ROOT / "tests" / "ops"))
    import test_sm90_compile as t  # noqa: E402 - the test module holds the kernel signatures

    src = t.SCRIPT.split("out = {}")[0].replace("triton.compile(ASTSource(", "return triton.compile(ASTSource(")
    path = Path(os.environ.get("TMPDIR", "/tmp")) / "rl_engine_sum_order_cases.py"
    path.write_text(src)  # triton.jit reads the kernels' source file
    scope = {"__name__": "sum_order_cases", "__file__": str(path)}
    exec(compile(src, str(path), "exec"), scope)  # noqa: S102 - the repository's own test script
    return scope["compile_"], scope["cases"]


def compile_cases(names) -> dict[str, str]:
    """sm_90 PTX of the named kernel cases, compiled as the package launches them
    (``enable_fp_fusion=False``), with the installed Triton; ``TRITON_INTERPRET`` must be unset."""
    compile_, cases = kernel_cases()
    out = {}
    for name, fn, sig, consts, *options in cases():
        if name in names:
            opts = dict(options[0]) if options else {}
            opts["enable_fp_fusion"] = False
            out[name] = compile_(fn, sig, consts, opts, *options[1:]).asm["ptx"]
    return out


def tree_shape(ptx: str, offset: int) -> str:
    """Shape of the add tree feeding the first ``shfl.sync.bfly`` with ``offset`` (see module doc)."""
    defs: dict[str, tuple[str, str]] = {}
    root = None
    for line in ptx.splitlines():
        m = re.search(r"add\.rn\.f32\s+(%r\d+), (%r\d+), (%r\d+)", line)
        if m:
            defs[m.group(1)] = (m.group(2), m.group(3))
        s = re.search(rf"shfl\.sync\.bfly\.b32\s+%r\d+, (%r\d+), {offset},", line)
        if s and s.group(1) in defs:
            root = s.group(1)
            break
    if root is None:
        return f"no add tree feeds a butterfly with offset {offset}"

    def expr(r: str) -> str:
        if r not in defs:
            return "x"
        a, b = defs[r]
        return f"({expr(a)}+{expr(b)})"

    e = expr(root)
    n = e.count("x")
    left = "x"
    right = "x"
    for _ in range(n - 1):
        left, right = f"({left}+x)", f"(x+{right})"
    balanced = "x"
    while balanced.count("x") < n:
        balanced = f"({balanced}+{balanced})"
    if e == left:
        return f"left fold of {n}"
    if e == right:
        return f"right fold of {n}"
    if e == balanced:
        return f"balanced tree of {n}"
    return f"{n} leaves: {e}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernels", nargs="+", help="case names of tests/ops/test_sm90_compile.py")
    ap.add_argument("--offset", type=int, default=2, help="the first butterfly offset of the sum (default 2)")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    import triton

    ptx = compile_cases(args.kernels)
    for name in args.kernels:
        if name in ptx:
            print(f"triton {triton.__version__}  {name}: {tree_shape(ptx[name], args.offset)}")
    missing = sorted(set(args.kernels) - set(ptx))
    if missing:
        raise SystemExit(f"not a case of tests/ops/test_sm90_compile.py: {missing}")


if __name__ == "__main__":
    main()
