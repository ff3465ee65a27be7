"""``rl-engine report DIR`` and ``rl-engine diff OLD NEW``."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    from rl_engine.cli.args import command

    p = command(sub, "report", "re-render report.md and report.html from DIR/evidence.json (or .json.gz) and print "
                               "the verdict",
                ["rl-engine report gate-out", "rl-engine report evidence/2026-11-30-h200-gate-f40096f"])
    p.add_argument("dir", help="a gate output folder (holding evidence.json, or evidence.json.gz), or the evidence "
                               "file (.json or .json.gz)")
    p.set_defaults(func=run_report)
    d = command(sub, "diff", "cells whose status changed and error deltas between two evidence artifacts",
                ["rl-engine diff old-run new-run", "rl-engine diff old-run/evidence.json new-run --json"],
                description="Cells whose status changed and error deltas between two evidence artifacts.\n\n"
                            "Exit 0 when no cell turned red (with --same-bits: every judged cell has the same\n"
                            "status and bits); 1 when a cell turned red (with --same-bits: a status or the bits\n"
                            "differ); 2 when the two cannot be compared: a different workload or contract (unless\n"
                            "--allow-different), or no cell in common (other ops, backends or judgments), so that\n"
                            "nothing would be compared.")
    d.add_argument("old", help="evidence.json (or .json.gz) or its folder")
    d.add_argument("new", help="evidence.json (or .json.gz) or its folder")
    d.add_argument("--json", action="store_true", help="print the changes as JSON")
    d.add_argument("--allow-different", action="store_true", help="diff artifacts of different workloads or contracts")
    d.add_argument("--same-bits", action="store_true",
                   help="exit 1 unless every cell has the same status and the same digest of its judged outputs' bits "
                        "(e.g. two hosts or two BLAS settings; see docs/cpu-interpreter.md)")
    d.set_defaults(func=run_diff)


def _path(p: str) -> Path:
    """The evidence file of argument ``p``: a folder's evidence.json or evidence.json.gz (older
    committed gate folders are gzipped), or the file given."""
    from rl_engine.gate import evidence as evidence_io

    return evidence_io.find(Path(p))


def run_report(args) -> int:
    """Re-render the reports, then print the verdict and the red cells as the gate does; exit 1 for
    a failed or incomplete run, 0 for a pass."""
    from rl_engine.errors import RLEngineError
    from rl_engine.gate import evidence as evidence_io
    from rl_engine.gate.report import recount, summary_lines, write_reports

    path = _path(args.dir)
    ev = recount(evidence_io.load(path))
    try:
        md, html = write_reports(ev, path.parent)
    except OSError as exc:
        raise RLEngineError(f"cannot write the reports into {path.parent}: "
                            f"{exc.strerror or exc} ({exc.filename or ''})") from exc
    print("\n".join(summary_lines(ev)))
    print(f"wrote {md} and {html}")
    if not ev.get("complete"):
        print(f"rl-engine report: {path} is an INCOMPLETE run (finish it with rl-engine gate --resume "
              f"{path.parent}); not a pass", file=sys.stderr)
        return 1
    return 0 if ev["summary"].get("red", 0) == 0 else 1


def _key(c):
    return (c["op"], c["backend"], c["judgment"], c.get("transform"))


def _outside(k, ev) -> bool:
    """Whether cell key ``k`` lies outside the matrix ``ev`` asked for (its ops, judgments, backends)."""
    op, backend, judgment, _ = k
    # the chain's cells (chain_parity and the chain's cross_backend cell) exist only in a run that
    # judged chain_parity: a run of a few ops (--ops) has the cross_backend judgment but no chain
    return ((op != "chain" and op not in ev["ops"]) or judgment not in ev["judgments"]
            or (op == "chain" and "chain_parity" not in ev["judgments"])
            or backend not in ev["backends"]["judged"])


def _max_err(c):
    errs = [r["accuracy"]["max_abs_error"] for r in c.get("details", {}).get("reports", []) if "accuracy" in r]
    errs = [e for e in errs if isinstance(e, (int, float))]
    return max(errs) if errs else None


def _digest(c) -> str | None:
    return (c or {}).get("details", {}).get("bits_digest")


def _host(ev) -> dict:
    sw = ev.get("provenance", {}).get("software", {})
    ha = sw.get("host_arithmetic", {})
    blas = "; ".join(f"{b.get('name')} {b.get('version')} {b.get('core_type')} x{b.get('threads')}"
                     for b in ha.get("blas", []) if b.get("api") == "blas")
    return {"numpy": sw.get("numpy"), "torch": sw.get("torch"), "triton": sw.get("triton"), "blas": blas or None,
            "numpy_simd": "/".join(ha.get("numpy_simd_dispatch_in_use", [])) or None,
            "torch_cpu_capability": ha.get("torch_cpu_capability"),
            **{k: v for k, v in ha.get("variables", {}).items()},
            "device": ev.get("provenance", {}).get("device", {}).get("name")}


def _host_differences(old, new) -> list[str]:
    a, b = _host(old), _host(new)
    return [f"{k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _matrix(ev) -> str:
    """``N cells of ops a, b on backend x (judgments j, k)``: what a run's cells cover, for messages."""
    def names(key):
        seen = list(dict.fromkeys(str(c.get(key)) for c in ev["cells"]))
        return ", ".join(seen[:6]) + (f" (+{len(seen) - 6} more)" if len(seen) > 6 else "")

    cells = ev["cells"]
    if not cells:
        return "no cells (an empty run)"
    return (f"{len(cells)} cell{'s' if len(cells) != 1 else ''} of ops {names('op')} on {names('backend')} "
            f"(judgments {names('judgment')})")


def run_diff(args) -> int:
    from collections import Counter

    from rl_engine.gate import evidence as evidence_io

    old, new = evidence_io.load(_path(args.old)), evidence_io.load(_path(args.new))
    differs = [k for k in ("workload", "contract_version") if
               (old[k]["name"] if k == "workload" else old[k]) != (new[k]["name"] if k == "workload" else new[k])]
    if differs and not args.allow_different:
        from rl_engine.errors import RLEngineError

        raise RLEngineError("the two artifacts differ in " + ", ".join(
            f"{k} ({old[k]['name'] if k == 'workload' else old[k]} vs {new[k]['name'] if k == 'workload' else new[k]})"
            for k in differs) + "; cell-by-cell deltas would compare unlike runs (pass --allow-different to force)")
    for label, ev, path in (("old", old, args.old), ("new", new, args.new)):
        if not ev.get("complete"):
            print(f"rl-engine diff: warning: the {label} artifact ({path}) is an incomplete run; its missing cells "
                  "show as 'absent'", file=sys.stderr)
    if old.get("seed") != new.get("seed"):
        print(f"rl-engine diff: warning: the artifacts used different seeds ({old.get('seed')} vs {new.get('seed')}): "
              "error deltas compare different inputs", file=sys.stderr)
    o, n = {_key(c): c for c in old["cells"]}, {_key(c): c for c in new["cells"]}
    if not set(o) & set(n):
        from rl_engine.errors import RLEngineError

        raise RLEngineError(f"the two runs have no cell in common, so nothing was compared: OLD ({args.old}) holds "
                            f"{_matrix(old)}; NEW ({args.new}) holds {_matrix(new)}; diff two runs of the same ops, "
                            "backends and judgments")
    # cells of a matrix only one run asked for (other --ops / --judgments / backends) are counted, not listed
    only_old = [k for k in o if k not in n and _outside(k, new)]
    only_new = [k for k in n if k not in o and _outside(k, old)]
    skip = set(only_old) | set(only_new)
    changes = []
    for k in sorted((set(o) | set(n)) - skip, key=lambda k: tuple(str(x) for x in k)):
        a, b = o.get(k), n.get(k)
        sa, sb = (a or {}).get("status", "absent"), (b or {}).get("status", "absent")
        ea, eb = (_max_err(a) if a else None), (_max_err(b) if b else None)
        da, db = _digest(a), _digest(b)
        bits_changed = da is not None and db is not None and da != db
        if sa != sb or (ea is not None and eb is not None and ea != eb) or bits_changed:
            changes.append({"cell": "/".join(str(x) for x in k if x), "old": sa, "new": sb,
                            "old_max_abs_error": ea, "new_max_abs_error": eb,
                            "delta": (eb - ea) if ea is not None and eb is not None else None,
                            "bits_changed": bits_changed})
    status_changes = [c for c in changes if c["old"] != c["new"]]
    bit_changes = [c for c in changes if c["bits_changed"]]
    judged = [k for k in (set(o) & set(n)) if o[k].get("status") in ("green", "red") or n[k].get("status") in ("green", "red")]
    no_digest = [k for k in judged if _digest(o[k]) is None or _digest(n[k]) is None]
    host_diffs = _host_differences(old, new)
    if args.json:
        print(json.dumps({"changes": changes, "status_changes": len(status_changes), "bit_changes": len(bit_changes),
                          "cells_without_digest": len(no_digest), "host_differences": host_diffs,
                          "cells_only_in_old": len(only_old), "cells_only_in_new": len(only_new)}, indent=1))
    else:
        if host_diffs:
            print("host and software differences (what could explain a bit change):")
            for line in host_diffs:
                print(f"  {line}")
        if skip:
            print(f"{len(only_old)} cell{'s' if len(only_old) != 1 else ''} only in OLD and {len(only_new)} only in NEW "
                  "(ops or judgments the other run did not ask for; not listed)")
        if not changes:
            print("no cell changed status or error" + (" among the cells both runs judged" if skip else ""))
        for c in changes:
            delta = f"  max_abs {c['old_max_abs_error']} -> {c['new_max_abs_error']}" if c["delta"] is not None else ""
            bits = "  bits differ" if c["bits_changed"] else ""
            print(f"{c['cell']}: {c['old']} -> {c['new']}{delta}{bits}")
        if changes:
            kinds = Counter(f"{c['old']} -> {c['new']}" for c in status_changes)
            print(f"{len(changes)} cell{'s' if len(changes) != 1 else ''} differ{'' if len(changes) != 1 else 's'}: "
                  f"{len(status_changes)} changed status"
                  + (f" ({', '.join(f'{v} {k}' for k, v in sorted(kinds.items()))})" if kinds else "")
                  + f", {len(changes) - len(status_changes)} changed only their max_abs_error or bits"
                  + (f" ({len(bit_changes)} changed the bits of their judged outputs)" if bit_changes else ""))
    if args.same_bits:
        if no_digest:
            print(f"rl-engine diff: {len(no_digest)} cells have no bits digest (an artifact from before digests were "
                  "recorded?): --same-bits cannot hold", file=sys.stderr)
        same = bool(judged) and not status_changes and not bit_changes and not no_digest
        print(f"same bits: {'yes' if same else 'NO'} ({len(judged)} judged cells compared"
              + (f"; {len(skip)} cells outside the other run's matrix not compared" if skip else "") + ")")
        return 0 if same else 1
    return 1 if any(c["new"] == "red" and c["old"] != "red" for c in status_changes) else 0
