"""Static scans of the package source (AST based, nothing is imported or executed).

* :func:`tolerance_literals` — numeric literals given to tolerance-named keywords, parameters
  or variables (docs/decisions.md 13: thresholds come only from the contract);
* :func:`unsafe_dots` — ``tl.dot`` calls without an explicit ``input_precision="ieee"``
  (WS1 §9.7, docs/pitfalls.md P6);
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TOL_KEYWORDS = {"atol", "rtol", "tol", "tolerance", "threshold"}
TOL_NAME_PARTS = ("atol", "rtol", "tolerance")


def python_files(root: Path, tops: tuple[str, ...] = ("rl_engine",)) -> Iterator[Path]:
    for top in tops:
        base = root / top
        if not base.exists():
            continue
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def _is_numeric_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        return _is_numeric_literal(node.operand)
    return (isinstance(node, ast.Constant) and isinstance(node.value, (int, float, complex))
            and not isinstance(node.value, bool))


def _target_names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        return [target.attr]
    return []


def _pairs(target: ast.AST, value: ast.AST | None):
    if value is None:
        return
    if isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts):
                yield from _pairs(t, v)
        return
    for name in _target_names(target):
        yield name, value


def tolerance_literals(source: str, filename: str) -> list[tuple[str, int, str]]:
    """``(file, line, message)`` for each tolerance literal."""
    tree = ast.parse(source, filename=filename)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in TOL_KEYWORDS and _is_numeric_literal(node.value):
            found.append((filename, node.value.lineno, f"keyword {node.arg}={ast.unparse(node.value)}"))
        pairs = []
        if isinstance(node, ast.Assign):
            for t in node.targets:
                pairs += list(_pairs(t, node.value))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            pairs += list(_pairs(node.target, node.value))
        elif isinstance(node, ast.NamedExpr):
            pairs += list(_pairs(node.target, node.value))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            positional = args.posonlyargs + args.args
            for a, d in zip(positional[len(positional) - len(args.defaults):], args.defaults):
                pairs.append((a.arg, d))
            for a, d in zip(args.kwonlyargs, args.kw_defaults):
                if d is not None:
                    pairs.append((a.arg, d))
        for name, value in pairs:
            lowered = name.lower()
            if (any(p in lowered for p in TOL_NAME_PARTS) or lowered in TOL_KEYWORDS) and _is_numeric_literal(value):
                found.append((filename, value.lineno, f"{name} = {ast.unparse(value)}"))
    return found


def _is_tl_dot(call: ast.Call) -> bool:
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr == "dot" and isinstance(f.value, ast.Name) and f.value.id == "tl"


def unsafe_dots(source: str, filename: str) -> list[tuple[str, int, str]]:
    """``tl.dot`` calls whose ``input_precision`` is missing or not the literal ``"ieee"``."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Call) and _is_tl_dot(node):
            kw = {k.arg: k.value for k in node.keywords}
            prec = kw.get("input_precision")
            if "allow_tf32" in kw:
                found.append((filename, node.lineno, "tl.dot uses allow_tf32 (deprecated); pass input_precision='ieee'"))
            elif not (isinstance(prec, ast.Constant) and prec.value == "ieee"):
                found.append((filename, node.lineno, "tl.dot without input_precision='ieee' (FP32 dots may run in TF32)"))
    return found


def dot_lines(source: str, filename: str) -> list[int]:
    """Line numbers of every ``tl.dot`` call."""
    return sorted(n.lineno for n in ast.walk(ast.parse(source, filename=filename)) if isinstance(n, ast.Call) and _is_tl_dot(n))


def jit_kernel_names(source: str, filename: str) -> set[str]:
    """Names of the functions decorated with ``triton.jit`` (or ``triton.jit(...)``) in ``source``."""
    names = set()
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(target, ast.Attribute) and target.attr == "jit" and isinstance(target.value, ast.Name) \
                        and target.value.id == "triton":
                    names.add(node.name)
    return names


def _kernel_name(call: ast.Call) -> str | None:
    """``kernel`` of a ``kernel[grid](...)`` launch (``mod.kernel`` too), else None."""
    if not isinstance(call.func, ast.Subscript):
        return None
    v = call.func.value
    return v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else None


def launches_without_fp_fusion(source: str, filename: str, kernels: set[str],
                               constant: str = "FP_FUSION") -> tuple[int, list[tuple[str, int, str]]]:
    """``(launches, findings)`` over the launches of ``kernels`` (``triton.jit`` functions): each must
    pass ``enable_fp_fusion=<constant>`` (the contract's FP contraction setting), never rely on
    Triton's default (fusion on)."""
    found, total = [], 0
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Call) and _kernel_name(node) in kernels:
            total += 1
            kw = {k.arg: k.value for k in node.keywords}
            value = kw.get("enable_fp_fusion")
            if value is None:
                found.append((filename, node.lineno, "Triton launch without enable_fp_fusion (Triton's default fuses a*b+c into an FMA)"))
            elif not (isinstance(value, ast.Name) and value.id == constant):
                found.append((filename, node.lineno, f"enable_fp_fusion={ast.unparse(value)} instead of the contract's {constant}"))
    return total, found
