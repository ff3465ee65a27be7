"""Tests compute expected kernel values with host-independent arithmetic (docs/cpu-interpreter.md).

PyTorch's FP32 CPU ``sqrt`` is not correctly rounded on every host: on an AMD EPYC host with CPU
capability AVX2 ``torch.sqrt(torch.tensor(147456.015625))`` returned 384.0 where the nearest FP32
value (NumPy's ``float32`` ``sqrt``, and the kernels' ``-prec-sqrt=true``) is 384.0000305, and a test
whose expected rstd went through it failed on that host only. An AST scan of tests/ fails on any
call of ``torch.sqrt`` / ``torch.rsqrt`` or a ``.sqrt()`` / ``.rsqrt()`` method: expected values are
NumPy ``float32`` steps; a tolerance-judged use would take the contract's reference instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FUNCS = ("sqrt", "rsqrt")


def host_sqrt_calls(source: str, filename: str) -> list[str]:
    """``file:line: call`` for each ``torch.sqrt(...)`` / ``torch.rsqrt(...)`` and each
    ``x.sqrt()`` / ``x.rsqrt()`` method call (no argument) in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FUNCS):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Name) and owner.id == "torch":
            found.append(f"{filename}:{node.lineno}: torch.{node.func.attr}")
        elif not node.args and not (isinstance(owner, ast.Name) and owner.id in ("np", "numpy", "math")):
            found.append(f"{filename}:{node.lineno}: .{node.func.attr}()")
    return found


def test_no_torch_sqrt_in_tests():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if "__pycache__" not in path.parts:
            found += host_sqrt_calls(path.read_text(), str(path.relative_to(TESTS.parent)))
    assert not found, "host-dependent sqrt in tests (use NumPy float32 steps):\n" + "\n".join(found)


def test_scanner_finds_each_form():
    """Negative control: every form the scan forbids is found, NumPy's and math's are not."""
    planted = ("import torch, numpy as np, math\n"
               "a = torch.sqrt(x)\nb = torch.rsqrt(x)\nc = x.sqrt()\nd = (x + 1).rsqrt()\n"
               "e = np.sqrt(np.float32(2))\nf = math.sqrt(2.0)\n")
    found = host_sqrt_calls(planted, "planted.py")
    assert [f.split(":")[1] for f in found] == ["2", "3", "4", "5"], found
