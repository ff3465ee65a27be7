"""Human reports rendered from ``evidence.json`` alone: ``report.md`` and a self-contained
``report.html`` (plots embedded as base64 PNG, no network)."""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

from rl_engine import OPS

_COLOURS = {"green": "#2e7d32", "red": "#c62828", "n/a": "#9e9e9e", "not provided": "#bdbdbd"}
_SHORT = {"forward_accuracy": "fwd acc", "gradient_accuracy": "grad acc", "forward_invariance": "fwd inv",
          "gradient_invariance": "grad inv", "chain_parity": "chain", "repeat": "repeat"}


def _columns(ev: dict[str, Any]) -> list[tuple[str, str | None]]:
    cols: list[tuple[str, str | None]] = []
    for c in ev["cells"]:
        key = (c["judgment"], c.get("transform"))
        if key not in cols and c["op"] != "chain":
            cols.append(key)
    return cols


def _grid(ev: dict[str, Any]) -> dict[tuple[str, str, str, str | None], dict[str, Any]]:
    return {(c["op"], c["backend"], c["judgment"], c.get("transform")): c for c in ev["cells"]}


def _col_name(j: str, t: str | None) -> str:
    return _SHORT.get(j, j) + (f" {t}" if t else "")


def _ops_in_order(ev: dict[str, Any]) -> list[str]:
    present = {c["op"] for c in ev["cells"]}
    return [op for op in OPS if op in present] + sorted(present - set(OPS) - {"chain"})


def _error_rows(ev: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for c in ev["cells"]:
        if c["judgment"] not in ("forward_accuracy", "gradient_accuracy"):
            continue
        for rep in c.get("details", {}).get("reports", []):
            acc = rep.get("accuracy")
            if not acc:
                continue
            rel = rep.get("relative", {})
            rows.append({"op": c["op"], "backend": c["backend"], "case": rep["case"], "path": acc["path"],
                         "max_abs": acc["max_abs_error"], "p99": acc["p99_abs_error"], "p999": acc["p999_abs_error"],
                         "atol": acc["atol"], "rtol": acc["rtol"], "passed": acc["passed"],
                         "baseline_max_abs": rel.get("baseline_max_abs_error"), "rel_ok": rel.get("passed"),
                         "histogram": acc.get("histogram")})
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3e}"
    return str(v)


def _device_text(dev: dict[str, Any]) -> str:
    if dev.get("kind") == "cuda":
        return f"{dev.get('name')} (cc {dev.get('compute_capability')}, SMs {dev.get('sm_count')})"
    return f"{dev.get('name')} (CPU; Triton kernels in the interpreter)"


def render_markdown(ev: dict[str, Any]) -> str:
    prov = ev["provenance"]
    s = ev["summary"]
    lines = [f"# rl_engine gate report — workload `{ev['workload']['name']}`", ""]
    verdict = "PASS (all cells green or n/a)" if s.get("red", 0) == 0 and ev["complete"] else "FAIL" if s.get("red", 0) else "INCOMPLETE"
    lines += [f"**Verdict: {verdict}** — green {s.get('green', 0)}, red {s.get('red', 0)}, n/a {s.get('n/a', 0)}"
              + (f", not provided {s['not provided']}" if s.get("not provided") else "")
              + ("" if ev["complete"] else " (run incomplete)"), ""]
    lines += ["| field | value |", "|---|---|",
              f"| contract | `{ev['contract_version']}` sha256 `{ev['contract']['sha256'][:16]}…` |",
              f"| commit | `{prov.get('git_commit')}` dirty={prov.get('git_dirty')} |",
              f"| device | {_device_text(prov['device'])} |",
              f"| software | python {prov['software']['python']}, torch {prov['software']['torch']}, triton {prov['software']['triton']}, "
              f"CUDA {prov['software'].get('torch_cuda') or 'none (CPU build of torch)'} |",
              f"| backends judged | {', '.join(ev['backends']['judged'])} |",
              f"| wall time | {ev['wall_time_s']:.1f} s |"]
    resumed = ev.get("resumed_from")
    if resumed:
        lines.append(f"| resumed | {resumed.get('cells_kept')} cells kept from an interrupted run "
                     f"(which had run {resumed.get('wall_time_s') or 0:.1f} s); the wall time above is this run's part |")
    for name, b in sorted(ev["backends"].get("builds", {}).items()):
        how = (f"error: {b['error']}" if "error" in b else
               f"{'loaded from cache; built' if b.get('cached') else 'cold build'} in {b.get('build_seconds', 0.0):.1f} s")
        lines.append(f"| {name} library | {how} |")
    lines.append("")
    for lo in ev["backends"]["left_out"]:
        lines.append(f"- backend **{lo['backend']}** left out: {lo['reason']} — the verdict covers only what ran.")
    if ev["backends"]["left_out"]:
        lines.append("")
    rc = ev.get("root_cause")
    if rc:
        lines += [f"**Root-cause hint:** `{rc['op']}` — {rc['hint']} (red: {', '.join(rc['cells'])})", ""]
    grid, cols = _grid(ev), _columns(ev)
    for backend in ev["backends"]["judged"]:
        lines += [f"## Matrix: `{backend}`", "", "| op | " + " | ".join(_col_name(j, t) for j, t in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for op in _ops_in_order(ev):
            row = []
            for j, t in cols:
                c = grid.get((op, backend, j, t))
                row.append("—" if c is None else {"green": "green", "red": "**RED**", "n/a": "n/a", "not provided": "not provided"}.get(c["status"], c["status"]))
            lines.append(f"| {op} | " + " | ".join(row) + " |")
        lines.append("")
    chain = [c for c in ev["cells"] if c["op"] == "chain"]
    if chain:
        lines += ["## Chain parity", "", "| backend | status | metrics |", "|---|---|---|"]
        for c in chain:
            m = c.get("details", {}).get("metrics", {})
            ms = ", ".join(f"{k}={_fmt(v.get('value') if isinstance(v, dict) else v)}" for k, v in m.items())
            lines.append(f"| {c['backend']} | {c['status']} | {ms or c.get('reason', '')} |")
        lines.append("")
    red = [c for c in ev["cells"] if c["status"] == "red"]
    if red:
        lines += ["## Red cells", ""]
        for c in red:
            lines.append(f"- `{c['op']}` / {c['backend']} / {_col_name(c['judgment'], c.get('transform'))}: {c.get('reason', '')}")
        lines.append("")
    na = defaultdict(list)
    for c in ev["cells"]:
        if c["status"] == "n/a":
            na[(c["op"], c.get("reason", ""))].append(_col_name(c["judgment"], c.get("transform")))
    if na:
        lines += ["## N/A cells and their reasons", ""]
        for (op, reason), cells in na.items():
            lines.append(f"- `{op}` ({', '.join(sorted(set(cells)))}): {reason}")
        lines.append("")
    rows = _error_rows(ev)
    if rows:
        lines += ["## Errors against the FP32 reference", "",
                  "| op | backend | case | tensor | max abs | P99 | P99.9 | atol / rtol | torch_bf16 max abs | pass |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['op']} | {r['backend']} | {r['case']} | `{r['path']}` | {_fmt(r['max_abs'])} | {_fmt(r['p99'])} | "
                         f"{_fmt(r['p999'])} | {r['atol']:g} / {r['rtol']:g} | {_fmt(r['baseline_max_abs'])} | "
                         f"{'yes' if r['passed'] and r['rel_ok'] is not False else 'NO'} |")
        lines.append("")
    cross = ev.get("cross_backend")
    if cross:
        lines += ["## Cross-backend comparison (informational, not a judgment)", "",
                  "| op | case | output | backends | max abs difference | bitwise equal |", "|---|---|---|---|---|---|"]
        for r in cross:
            if "error" in r:
                lines.append(f"| {r['op']} | — | — | — | {r['error']} | — |")
            else:
                lines.append(f"| {r['op']} | {r['case']} | {r['output']} | {' vs '.join(r['backends'])} | "
                             f"{_fmt(r['max_abs_difference'])} | {'yes' if r['bitwise_equal'] else 'no'} |")
        lines.append("")
    audit = ev.get("audit")
    if audit:
        lines += ["## Conformance audit (`rl-engine audit`)", "",
                  f"Overall: {'conformant' if audit['conformant'] else 'NON-CONFORMANT'}" + (f" — {audit['error']}" if audit.get("error") else ""), "",
                  "| component | status | findings |", "|---|---|---|"]
        for r in audit["rows"]:
            lines.append(f"| {r['component']} | {r['status']} | {'; '.join(r['findings'][:3]) or '—'} |")
        lines.append("")
    lines += [f"Invariance is bitwise on raw bits (+0 ≠ −0), NaN policy `{_nan_policy(ev)}`. Every invariance cell also ran its "
              "negative controls; a control that is not caught turns the cell red.", ""]
    return "\n".join(lines)


def _nan_policy(ev: dict[str, Any]) -> str:
    if ev.get("nan_policy"):
        return ev["nan_policy"]
    for c in ev["cells"]:
        p = c.get("details", {}).get("nan_policy")
        if p:
            return p
    return "see contract"


def _plot_op(rows: list[dict[str, Any]], title: str) -> str | None:
    """Histogram (bars) and CDF (line) of absolute error per tensor, threshold drawn; base64 PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    merged: dict[str, dict[str, Any]] = {}
    for r in rows:
        h = r.get("histogram")
        if not h:
            continue
        m = merged.setdefault(r["path"], {"counts": [0] * len(h["counts"]), "bins": h["bins"], "atol": r["atol"]})
        m["counts"] = [a + b for a, b in zip(m["counts"], h["counts"])]
    if not merged:
        return None
    fig, axes = plt.subplots(1, len(merged), figsize=(4.2 * len(merged), 3.0), squeeze=False)
    for ax, (path, m) in zip(axes[0], merged.items()):
        counts, bins = m["counts"], m["bins"]
        total = max(1, sum(counts))
        xs = list(range(len(counts)))
        ax.bar(xs, [c / total for c in counts], color="#5c6bc0", label="fraction")
        cdf, acc = [], 0
        for c in counts:
            acc += c
            cdf.append(acc / total)
        ax.plot(xs, cdf, color="#ef6c00", marker=".", label="CDF")
        # threshold: the decade bin holding atol
        edges = [float(b[2:]) for b in bins[1:-1]]
        tpos = next((i + 1 for i, e in enumerate(edges) if m["atol"] <= e), len(xs) - 1)
        ax.axvline(tpos, color="#c62828", linestyle="--", label=f"atol {m['atol']:g}")
        ax.set_xticks(xs)
        ax.set_xticklabels(bins, rotation=90, fontsize=6)
        ax.set_ylim(0, 1.05)
        ax.set_title(path, fontsize=8)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def render_html(ev: dict[str, Any], markdown_text: str | None = None) -> str:
    grid, cols = _grid(ev), _columns(ev)
    s = ev["summary"]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>rl_engine gate report</title><style>",
             "body{font-family:sans-serif;margin:24px;max-width:1400px} table{border-collapse:collapse;font-size:12px}",
             "td,th{border:1px solid #ccc;padding:3px 6px} td.c{color:#fff;text-align:center}",
             "pre{background:#f5f5f5;padding:8px;white-space:pre-wrap}</style></head><body>",
             f"<h1>rl_engine gate — workload <code>{html.escape(ev['workload']['name'])}</code></h1>",
             f"<p><b>green {s.get('green', 0)}, red {s.get('red', 0)}, n/a {s.get('n/a', 0)}</b>"
             f"{'' if ev['complete'] else ' — <b>run incomplete</b>'}; contract <code>{html.escape(ev['contract_version'])}</code>; "
             f"commit <code>{html.escape(str(ev['provenance'].get('git_commit')))}</code> (dirty={ev['provenance'].get('git_dirty')}); "
             f"device {html.escape(str(ev['provenance']['device'].get('name')))}; wall time {ev['wall_time_s']:.1f} s</p>"]
    for lo in ev["backends"]["left_out"]:
        parts.append(f"<p>Backend <b>{html.escape(lo['backend'])}</b> left out: {html.escape(lo['reason'])}</p>")
    rc = ev.get("root_cause")
    if rc:
        parts.append(f"<p style='color:#c62828'><b>Root-cause hint:</b> <code>{html.escape(rc['op'])}</code> — {html.escape(rc['hint'])}</p>")
    for backend in ev["backends"]["judged"]:
        parts.append(f"<h2>Matrix: {html.escape(backend)}</h2><table><tr><th>op</th>")
        parts += [f"<th>{html.escape(_col_name(j, t))}</th>" for j, t in cols]
        parts.append("</tr>")
        for op in _ops_in_order(ev):
            parts.append(f"<tr><td>{html.escape(op)}</td>")
            for j, t in cols:
                c = grid.get((op, backend, j, t))
                if c is None:
                    parts.append("<td></td>")
                    continue
                tip = html.escape(c.get("reason", "") or "")
                parts.append(f"<td class='c' style='background:{_COLOURS.get(c['status'], '#000')}' title='{tip}'>{html.escape(c['status'])}</td>")
            parts.append("</tr>")
        parts.append("</table>")
    rows = _error_rows(ev)
    by_op: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_op[(r["op"], r["backend"])].append(r)
    if by_op:
        parts.append("<h2>Error distributions against the FP32 reference</h2>")
    for (op, backend), rs in by_op.items():
        img = _plot_op(rs, f"{op} / {backend}: |candidate - reference| by decade")
        if img:
            parts.append(f"<h3>{html.escape(op)} / {html.escape(backend)}</h3><img alt='{html.escape(op)} error distribution' src='data:image/png;base64,{img}'/>")
    if markdown_text:
        parts.append("<h2>Full report (markdown)</h2><pre>" + html.escape(markdown_text) + "</pre>")
    parts.append("</body></html>")
    return "".join(parts)


def write_plots(ev: dict[str, Any], out_dir: Path) -> list[tuple[str, str, str]]:
    """One PNG per (op, backend) under ``out_dir/plots/``, named from the evidence's op and backend
    names through :func:`rl_engine.cli.io.safe_output_path` (a crafted name cannot leave the folder).
    Returns ``(op, backend, relative path)`` for the markdown report."""
    from rl_engine.cli.io import safe_output_path

    by_op: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in _error_rows(ev):
        by_op[(r["op"], r["backend"])].append(r)
    plots = []
    folder = out_dir / "plots"
    for (op, backend), rs in by_op.items():
        target = safe_output_path(folder, f"{op}-{backend}.png")  # validated before anything is written
        img = _plot_op(rs, f"{op} / {backend}: |candidate - reference| by decade")
        if img:
            folder.mkdir(parents=True, exist_ok=True)
            target.write_bytes(base64.b64decode(img))
            plots.append((op, backend, f"plots/{target.name}"))
    if folder.is_dir():  # plots of an earlier run in this folder would sit beside a report that no longer shows them
        keep = {rel.split("/", 1)[1] for _, _, rel in plots}
        for old in folder.glob("*.png"):
            if old.name not in keep:
                old.unlink()
    return plots


def recount(ev: dict[str, Any]) -> dict[str, Any]:
    """The evidence with its summary and root cause recomputed from its cells (a report never
    trusts a stored summary: a hand-edited file could disagree with its own cells)."""
    from rl_engine.gate.runner import root_cause

    summary = {"green": 0, "red": 0, "n/a": 0, "not provided": 0}
    for c in ev["cells"]:
        summary[c["status"]] = summary.get(c["status"], 0) + 1
    return {**ev, "summary": summary, "root_cause": root_cause(ev["cells"])}


def write_reports(ev: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    ev = recount(ev)
    plots = write_plots(ev, out_dir)
    md = render_markdown(ev)
    if plots:
        md += "\n## Error distribution plots\n\n" + "\n".join(f"![{op} / {b}]({rel})" for op, b, rel in plots) + "\n"
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(md)
    html_path.write_text(render_html(ev, md))
    return md_path, html_path
