"""The evidence folder's layout rule (evidence/README.md): rendered plots live only in the newest
gate folder (one folder, of the newest date: names sort by date, not by time within a day). The device tool copies at most 64 MiB of working tree per call, and each gate's
plots are about 6 MiB, so keeping every gate's plots stops the device calls (it did twice).

The same limit makes every other ``evidence.json`` stored gzipped (``evidence.json.gz``, which
``rl-engine report`` and ``rl-engine diff`` read): a gate's is about 1.6 MB of JSON. The newest gate
folder keeps a plain one; as for plots, "newest" is by date, so any gate folder of the newest date
may (what the gate writes is plain, and a day can hold several gates)."""
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


def plain_evidence_outside_the_newest_gate(root: Path) -> list[str]:
    """Plain ``evidence.json`` files (at any depth) outside the gate folders of the newest date:
    each of these should be stored as ``evidence.json.gz``."""
    newest = newest_gate_date(root)
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("evidence.json")
                  if not (p.relative_to(root).parts[0][:10] == newest and "-gate-" in p.relative_to(root).parts[0]))


def test_evidence_json_is_gzipped_outside_the_newest_gate_folder():
    plain = plain_evidence_outside_the_newest_gate(EVIDENCE)
    assert not plain, (f"plain evidence.json outside the newest gate folder: {plain}; store each as evidence.json.gz "
                       "(gzip -9n, then git rm the plain file and git add the .gz; evidence/README.md)")


def test_the_rule_flags_a_plain_evidence_json_outside_the_newest_gate(tmp_path):
    old, new = tmp_path / "2026-12-03-h200-gate-aaaaaaa", tmp_path / "2026-12-04-h200-gate-bbbbbbb"
    for folder in (old, new):
        folder.mkdir()
        (folder / "evidence.json").write_text("{}")
    assert plain_evidence_outside_the_newest_gate(tmp_path) == ["2026-12-03-h200-gate-aaaaaaa/evidence.json"]
    (old / "evidence.json").rename(old / "evidence.json.gz")
    assert plain_evidence_outside_the_newest_gate(tmp_path) == []
    # a folder of the newest date that is not a gate's, with the file one level down, is flagged too
    nested = tmp_path / "2026-12-04-h200-chain-ccccccc" / "norm-gate"
    nested.mkdir(parents=True)
    (nested / "evidence.json").write_text("{}")
    assert plain_evidence_outside_the_newest_gate(tmp_path) == ["2026-12-04-h200-chain-ccccccc/norm-gate/evidence.json"]
