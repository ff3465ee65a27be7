"""The evidence folder's layout rule (evidence/README.md): rendered plots live only in the newest
gate folder (one folder, of the newest date: names sort by date, not by time within a day). The device tool copies at most 64 MiB of working tree per call, and each gate's
plots are about 6 MiB, so keeping every gate's plots stops the device calls (it did twice)."""
from pathlib import Path

EVIDENCE = Path(__file__).resolve().parent.parent / "evidence"


def folders_with_plots(root: Path) -> list[str]:
    return sorted(p.parent.name for p in root.glob("*/plots") if any(p.iterdir()))


def newest_gate_date(root: Path) -> str | None:
    dates = sorted(p.name[:10] for p in root.glob("*-gate-*") if p.is_dir())
    return dates[-1] if dates else None


def plots_rule_holds(root: Path) -> bool:
    with_plots = folders_with_plots(root)
    return len(with_plots) <= 1 and all(name[:10] == newest_gate_date(root) for name in with_plots)


def test_plots_only_in_the_newest_gate_folder():
    assert plots_rule_holds(EVIDENCE), (
        f"plots/ in {folders_with_plots(EVIDENCE)}: keep them in the newest gate folder only (git rm -r the others')")


def test_the_rule_flags_an_older_gate_with_plots(tmp_path):
    for name in ("2026-12-03-h200-gate-aaaaaaa", "2026-12-04-h200-gate-bbbbbbb"):
        (tmp_path / name / "plots").mkdir(parents=True)
        (tmp_path / name / "plots" / "chain-parity.png").write_bytes(b"png")
    assert not plots_rule_holds(tmp_path)
    for png in (tmp_path / "2026-12-04-h200-gate-bbbbbbb" / "plots").iterdir():
        png.unlink()
    assert not plots_rule_holds(tmp_path)  # one folder with plots, but not the newest date's
    (tmp_path / "2026-12-03-h200-gate-aaaaaaa" / "plots" / "chain-parity.png").unlink()
    (tmp_path / "2026-12-04-h200-gate-bbbbbbb" / "plots" / "chain-parity.png").write_bytes(b"png")
    assert plots_rule_holds(tmp_path)
