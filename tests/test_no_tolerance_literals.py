"""No tolerance literal outside the contract (docs/decisions.md 13, standard §2.2).

An AST scan of every .py under rl_engine/ and tests/ fails on
* a keyword argument named atol / rtol / tol / tolerance / threshold whose value is a numeric literal;
* an assignment of a numeric literal to a name containing "atol", "rtol" or "tolerance".
"""

from __future__ import annotations

from pathlib import Path

from rl_engine.audit.scan import tolerance_literals

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("rl_engine", "tests")


def scan_source(source: str, filename: str) -> list[str]:
    """Findings as ``file:line: message`` (the scanner is the audit's, rl_engine.audit.scan)."""
    return [f"{f}:{line}: {msg}" for f, line, msg in tolerance_literals(source, filename)]


def scan_tree(root: Path) -> list[str]:
    found = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            found += scan_source(path.read_text(), str(path.relative_to(root)))
    return found


def test_no_tolerance_literals_in_package_and_tests():
    found = scan_tree(ROOT)
    assert not found, "tolerance literals (take thresholds from load_contract()):\n" + "\n".join(found)


def test_scanner_sees_the_files():
    files = [p for top in SCANNED for p in (ROOT / top).rglob("*.py")]
    assert any(p.name == "compare.py" for p in files) and any(p.name == Path(__file__).name for p in files)


def test_scanner_catches_planted_literals(tmp_path):
    """Negative control: every form the rule names is caught, with its file and line."""
    planted = tmp_path / "rl_engine" / "planted.py"
    planted.parent.mkdir()
    (tmp_path / "tests").mkdir()
    lines = [
        "import torch",                                                     # 1
        "torch.testing.assert_close(a, b, atol=0.01, rtol=1.6e-2)",         # 2: two hits
        "ok = torch.allclose(a, b, tol=-1)",                                # 3
        "check(x, tolerance=3)",                                            # 4
        "gate(x, threshold=0)",                                             # 5
        "my_atol = 5e-2",                                                   # 6
        "RTOL_BF16: float = 1.6e-2",                                        # 7
        "cfg.tolerance = 0.5",                                              # 8
        "a_atol, b_rtol = 1e-3, 1e-3",                                      # 9: two hits
        "def f(x, atol=1e-5, *, rtol=0.0): pass",                           # 10: two hits
        "tol = load_contract().tolerance('forward', 'reduction')",          # 11: fine
        "assert_close(a, b, atol=tol.atol, rtol=tol.rtol)",                 # 12: fine
        "plain = 0.01",                                                     # 13: fine (not a tolerance name)
        "use_threshold = True",                                             # 14: fine (bool)
    ]
    planted.write_text("\n".join(lines) + "\n")
    found = scan_tree(tmp_path)
    hit_lines = sorted(int(f.split(":")[1]) for f in found)
    assert hit_lines == [2, 2, 3, 4, 5, 6, 7, 8, 9, 9, 10, 10], found
    assert all(f.startswith(str(Path("rl_engine") / "planted.py") + ":") for f in found)
    assert any("atol=0.01" in f for f in found)
