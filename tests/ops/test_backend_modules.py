"""The backend modules hold kernels and launchers only (issue #18).

* No backend module (``rl_engine/ops/<op>/triton.py``, ``cuda.py``) imports another backend's module
  or an op's ``api`` (imports inside functions included), and none defines an autograd Function:
  each op has one autograd path, registered on its torch ops in ``api.py``.
* The CUDA backend imports without Triton: every op's ``api`` and ``cuda`` module load in a fresh
  process where ``import triton`` fails.

Each source check has a negative control on a planted snippet.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import rl_engine

OPS_DIR = Path(rl_engine.__file__).resolve().parent / "ops"
BACKENDS = ("triton", "cuda")


def _imported_modules(tree: ast.AST, package: str) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def problems_of(source: str, backend: str, package: str) -> list[str]:
    """What breaks the rule in one backend module's source (``backend``: "triton" or "cuda")."""
    tree = ast.parse(source)
    other = "cuda" if backend == "triton" else "triton"
    found = []
    for mod in sorted(_imported_modules(tree, package)):
        parts = mod.split(".")
        if parts[:2] == ["rl_engine", "ops"] and len(parts) >= 4 and parts[3] in (other, "api"):
            found.append(f"imports {mod}")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any("Function" in ast.unparse(b) for b in node.bases):
            found.append(f"defines autograd Function {node.name}")
    return found


def _backend_files() -> list[Path]:
    return sorted(p for b in BACKENDS for p in OPS_DIR.glob(f"*/{b}.py"))


def test_backend_modules_import_no_other_backend_and_define_no_function():
    files = _backend_files()
    assert len(files) >= 20, f"expected the ops' triton.py and cuda.py files, found {len(files)}"
    bad = {}
    for p in files:
        found = problems_of(p.read_text(), p.stem, f"rl_engine.ops.{p.parent.name}")
        if found:
            bad[str(p.relative_to(OPS_DIR))] = found
    assert not bad, bad


def test_the_source_check_can_fail():
    planted = ("import torch\n"
               "def f():\n    from rl_engine.ops.rms_norm.triton import rms_norm_fwd\n"
               "class _X(torch.autograd.Function):\n    pass\n")
    found = problems_of(planted, "cuda", "rl_engine.ops.rms_norm")
    assert any("rl_engine.ops.rms_norm.triton" in f for f in found) and any("_X" in f for f in found), found
    assert problems_of("from rl_engine.ops.rms_norm import api\n", "triton", "rl_engine.ops.rms_norm")


_NO_TRITON = """
import importlib, sys
sys.modules["triton"] = None  # "import triton" raises ImportError from here on
from rl_engine import OPS
failed = []
for op in OPS:
    for m in ("api", "cuda"):
        name = f"rl_engine.ops.{op}.{m}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if not (m == "cuda" and exc.name == name):  # an op without CUDA launchers of its own
                failed.append(f"{name}: {exc!r}")
        except ImportError as exc:
            failed.append(f"{name}: {exc!r}")
print("FAILED" if failed else "OK", failed)
"""


def _run_without_triton(code: str) -> str:
    root = Path(rl_engine.__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    return out.stdout + out.stderr


def test_cuda_backend_imports_without_triton():
    out = _run_without_triton(_NO_TRITON)
    assert out.startswith("OK"), out


def test_the_no_triton_check_can_fail():
    out = _run_without_triton(_NO_TRITON.replace('for m in ("api", "cuda")', 'for m in ("api", "cuda", "triton")'))
    assert out.startswith("FAILED") and "rl_engine.ops.rms_norm.triton" in out, out
