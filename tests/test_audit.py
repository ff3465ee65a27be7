"""``rl-engine audit``: exits 0 on this tree; planted faults in a temporary copy are named by file:line."""

from __future__ import annotations

import shutil
from pathlib import Path

from rl_engine.audit.checks import PACKAGE_ROOT, check_reference_guard
from rl_engine.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


def _copy_tree(tmp_path: Path) -> Path:
    dst = tmp_path / "checkout"
    shutil.copytree(ROOT / "rl_engine", dst / "rl_engine", ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "tests").mkdir()
    return dst


def test_audit_static_passes_on_this_tree(capsys):
    assert main(["audit", "--static-only"]) == 0
    out = capsys.readouterr().out
    assert "input_precision='ieee'" in out and "conformant" in out


def test_audit_full_passes_on_this_tree(capsys):
    assert main(["audit", "--json"]) == 0


def test_planted_tf32_dot_and_tolerance_literal_are_named(tmp_path, capsys):
    root = _copy_tree(tmp_path)
    planted = root / "rl_engine" / "ops" / "silu" / "planted.py"
    planted.write_text(
        "import triton.language as tl\n"          # 1
        "\n"                                        # 2
        "def k(a, b):\n"                            # 3
        "    return tl.dot(a, b)\n"                 # 4: FP32 dot that may run in TF32
        "\n"                                        # 5
        "CHECK_ATOL = 1e-3\n"                       # 6: a tolerance literal
    )
    rc = main(["audit", "--static-only", "--root", str(root)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "rl_engine/ops/silu/planted.py:4" in out
    assert "rl_engine/ops/silu/planted.py:6" in out


def test_planted_launches_without_the_contracts_fp_fusion_are_named(tmp_path, capsys):
    root = _copy_tree(tmp_path)
    planted = root / "rl_engine" / "ops" / "silu" / "planted.py"
    planted.write_text(
        "import triton\n"                                         # 1
        "\n"                                                       # 2
        "@triton.jit\n"                                            # 3
        "def _k(x):\n"                                             # 4
        "    pass\n"                                               # 5
        "\n"                                                       # 6
        "def launch(x):\n"                                         # 7
        "    _k[(1,)](x)\n"                                        # 8: Triton's default fusion
        "    _k[(1,)](x, enable_fp_fusion=True)\n"                 # 9: not the contract's constant
        "    TABLE[x](x)\n"                                        # 10: a dict lookup, not a launch
    )
    rc = main(["audit", "--static-only", "--root", str(root)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "rl_engine/ops/silu/planted.py:8" in out and "rl_engine/ops/silu/planted.py:9" in out
    assert "planted.py:10" not in out


def test_reference_tf32_tripwire_catches_an_unguarded_matmul(monkeypatch):
    """Negative control of the runtime check: a reference that multiplies outside the guard."""
    import torch

    from rl_engine.ops.registry import get_spec

    spec = get_spec("silu")
    original = spec.impls["reference_fp32"]

    def leaky_reference(x):
        _ = x @ x.t()  # runs with whatever TF32 setting is global
        return original(x)

    before = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
    monkeypatch.setitem(spec.impls, "reference_fp32", leaky_reference)
    row = check_reference_guard(PACKAGE_ROOT)
    assert row.status == "non-conformant"
    assert any("test_audit.py" in f for f in row.findings), row.findings
    assert (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()) == before
