"""Human reports rendered from ``evidence.json`` alone: ``report.md`` and a self-contained
``report.html`` (plots embedded as base64 PNG ``data:`` URIs, no network).

Both open with the verdict (PASS / FAIL / INCOMPLETE, what ran and what was left out), then the
matrix, then every red cell with its full reason and where it sits in ``evidence.json``, then the
rest. ``report.html`` is rendered from the Jinja2 template ``templates/report.html.j2``; the
detail sections are the markdown report's own, rendered by markdown-it-py. :func:`summary_lines`
is the same verdict for a terminal (``rl-engine gate`` and ``rl-engine report`` print it).
"""

from __future__ import annotations

import base64
import io
import math
import multiprocessing
import os
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rl_engine.constants import OPS
from rl_engine.jsonio import write_bytes_atomic, write_text_atomic

STATUSES = ("green", "red", "n/a", "not provided")
_SHORT = {"forward_accuracy": "fwd acc", "gradient_accuracy": "grad acc", "forward_invariance": "fwd inv",
          "gradient_invariance": "grad inv", "chain_parity": "chain", "repeat": "repeat",
          "cross_backend": "cross"}
PLOT_DPI = 100
PLOT_PROCESS_MIN = 8
"""From this many per-op plots on, :func:`write_plots` renders them in worker processes, one per
available CPU: matplotlib's constrained layout takes about 0.6 s of CPU per panel, and a qwen3-8b
gate has 26 figures of 2-4 panels (about 50 s in one process on the H200 host, which then ran past
the device call's limit after the last cell)."""
PLOT_FONT_PT = 10
OURS_COLOUR, BASELINE_COLOUR, BOUND_COLOUR = "#1565c0", "#ef6c00", "#c62828"


# ------------------------------------------------------------------------------------------------
# what every rendering shares: the verdict, the red cells


def cell_tag(c: dict[str, Any]) -> str:
    """``op/backend/judgment[/transform]``: how a cell is named in every report and on the terminal."""
    return f"{c['op']}/{c['backend']}/{c['judgment']}" + (f"/{c['transform']}" if c.get("transform") else "")


def verdict(ev: dict[str, Any]) -> dict[str, Any]:
    """``{"word": PASS|FAIL|INCOMPLETE, "counts": "...", "ran": "...", "left_out": [...], "notes": [...]}``.

    FAIL as soon as a cell is red (even in an unfinished run); INCOMPLETE when the run did not
    finish or nothing was judged (every cell n/a or not provided); PASS otherwise."""
    s = ev["summary"]
    red, green = s.get("red", 0), s.get("green", 0)
    notes = []
    if red:
        word = "FAIL"
    elif not ev.get("complete") or green == 0:
        word = "INCOMPLETE"
    else:
        word = "PASS"
    if not ev.get("complete"):
        notes.append(f"the run did not finish: {len(ev['cells'])} cells recorded; finish it with "
                     "`rl-engine gate --resume DIR`")
    if green + red == 0:
        notes.append("nothing was judged: every cell is n/a or not provided")
    missing = _not_provided(ev)
    counts = ", ".join(f"{s.get(k, 0)} {k}" for k in STATUSES if s.get(k, 0) or k in ("green", "red"))
    if s.get("not provided") and missing:  # name who did not provide them: PASS never hides that coverage
        by = [f"{len(cells)} by {b}" for b, cells in missing.items()]
        counts += (f" by {next(iter(missing))}" if len(missing) == 1 else f" ({', '.join(by)})") + " and not judged"
    judged = ev["backends"]["judged"]
    ops = ev.get("ops", [])
    ran = (f"{len(ev['cells'])} cells: {len(ops)} op{'s' if len(ops) != 1 else ''} x "
           f"{len(ev.get('judgments', []))} judgment{'s' if len(ev.get('judgments', [])) != 1 else ''} "
           f"on {', '.join(judged)}; workload {ev['workload']['name']}")
    left = [f"backend {lo['backend']}: {lo['reason']}" for lo in ev["backends"].get("left_out", [])]
    for backend, cells in missing.items():
        left.append(f"{len(cells)} cell{'s' if len(cells) != 1 else ''} not provided by {backend} (not judged): "
                    + _not_provided_why(ev, backend, cells))
    if s.get("not provided") and not missing:  # a hand-edited summary without the cells behind it
        left.append(f"{s['not provided']} cells not provided by their backend (not judged)")
    return {"word": word, "counts": counts, "ran": ran, "left_out": left, "notes": notes}


def _not_provided(ev: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The ``not provided`` cells per backend, in the order the backends first appear."""
    out: dict[str, list[dict[str, Any]]] = {}
    for c in ev["cells"]:
        if c["status"] == "not provided":
            out.setdefault(c["backend"], []).append(c)
    return out


def _not_provided_why(ev: dict[str, Any], backend: str, cells: list[dict[str, Any]]) -> str:
    """Why ``backend``'s cells were not provided, in a few words: the ops it has no implementation
    of, the chain (built-in backends only), and for the rest one example reason."""
    ops_of_backend: dict[str, list[str]] = {}
    for c in ev["cells"]:
        if c["backend"] == backend:
            ops_of_backend.setdefault(c["op"], []).append(c["status"])
    absent = [op for op, st in ops_of_backend.items() if op != "chain" and all(x == "not provided" for x in st)]
    parts = []
    if absent:
        parts.append(f"no implementation of {', '.join(absent)}")
    if any(c["op"] == "chain" for c in cells):
        parts.append("the chain runs on built-in backends only")
    rest = [c for c in cells if c["op"] != "chain" and c["op"] not in absent]
    if rest:
        ops = list(dict.fromkeys(c["op"] for c in rest))
        parts.append(f"{len(rest)} cell{'s' if len(rest) != 1 else ''} of {', '.join(ops)} "
                     f"(e.g. {one_line(rest[0].get('reason', ''), 100)})")
    return "; ".join(parts)


def one_line(reason: str, width: int = 160) -> str:
    """The first line of a reason, cut at ``width`` characters (the full text stays in the reports)."""
    line = (reason or "").strip().splitlines()[0] if (reason or "").strip() else "(no reason given)"
    return line if len(line) <= width else line[: width - 1] + "…"


def red_cells(ev: dict[str, Any]) -> list[dict[str, Any]]:
    """Every red cell with its tag, full reason and where it is in ``evidence.json``."""
    reds = [(i, c) for i, c in enumerate(ev["cells"]) if c["status"] == "red"]
    return [{"tag": cell_tag(c), "reason": c.get("reason") or "(no reason given)", "anchor": f"red-{k + 1}",
             "evidence_path": f"evidence.json → cells[{i}]", "cell": c} for k, (i, c) in enumerate(reds)]


def summary_lines(ev: dict[str, Any]) -> list[str]:
    """The verdict for a terminal: one line with the counts, one per red cell with its one-line
    reason, the root-cause hint, and what was left out."""
    v = verdict(ev)
    lines = [f"{v['word']}: {v['counts']} ({v['ran']})"]
    for n in v["notes"]:
        lines.append(f"  note: {n}")
    for lo in v["left_out"]:
        lines.append(f"  left out: {lo}")
    reds = red_cells(ev)
    if reds:
        lines.append(f"red cells ({len(reds)}):")
        lines += [f"  RED {r['tag']}: {one_line(r['reason'])}" for r in reds]
    rc = ev.get("root_cause")
    if rc:
        lines.append(f"root-cause hint: {rc['op']} (the earliest failing op in the model's op order; fix it first)")
    return lines


# ------------------------------------------------------------------------------------------------
# tables


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
            base = rep.get("baseline_accuracy", {})
            rows.append({"op": c["op"], "backend": c["backend"], "case": rep["case"], "path": acc["path"],
                         "max_abs": acc["max_abs_error"], "p99": acc["p99_abs_error"], "p999": acc["p999_abs_error"],
                         "atol": acc["atol"], "rtol": acc["rtol"], "passed": acc["passed"],
                         "baseline_max_abs": rel.get("baseline_max_abs_error"), "rel_ok": rel.get("passed"),
                         "rel_bound": rel.get("bound"), "rel_factor": rel.get("factor"),
                         "dtype": acc.get("candidate_dtype"),
                         "histogram": acc.get("histogram"), "ulp_histogram": acc.get("ulp_histogram"),
                         "baseline_histogram": base.get("histogram"),
                         "baseline_ulp_histogram": base.get("ulp_histogram")})
    return rows


def _num(v: Any) -> float | None:
    """A number from evidence (strict JSON stores inf/NaN as strings)."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v in ("inf", "-inf", "nan"):
        return float(v)
    return None


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3e}"
    return str(v)


def _device_text(dev: dict[str, Any]) -> str:
    if dev.get("kind") == "cuda":
        return f"{dev.get('name')} (cc {dev.get('compute_capability')}, SMs {dev.get('sm_count')})"
    return f"{dev.get('name')} (CPU; Triton kernels in the interpreter)"


def _md_cell(text: Any) -> str:
    """Text safe inside a markdown table cell (a reason may hold '|' or line breaks)."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _nan_policy(ev: dict[str, Any]) -> str:
    if ev.get("nan_policy"):
        return ev["nan_policy"]
    for c in ev["cells"]:
        p = c.get("details", {}).get("nan_policy")
        if p:
            return p
    return "see contract"


# ------------------------------------------------------------------------------------------------
# markdown


def _md_head(ev: dict[str, Any]) -> list[str]:
    v = verdict(ev)
    lines = [f"# rl_engine gate report — workload `{ev['workload']['name']}`", "",
             f"**Verdict: {v['word']}** — {v['counts']}" + ("" if ev["complete"] else " (run incomplete)"), "",
             f"Ran: {v['ran']}.", ""]
    for n in v["notes"]:
        lines.append(f"- {n}")
    for lo in v["left_out"]:
        lines.append(f"- left out: {lo} — the verdict covers only what ran.")
    if v["notes"] or v["left_out"]:
        lines.append("")
    rc = ev.get("root_cause")
    if rc:
        lines += [f"**Root-cause hint:** `{rc['op']}` — {rc['hint']} (red: {', '.join(rc['cells'])})", ""]
    return lines


def _md_matrix(ev: dict[str, Any]) -> list[str]:
    grid, cols = _grid(ev), _columns(ev)
    lines = []
    for backend in ev["backends"]["judged"]:
        lines += [f"## Matrix: `{backend}`", "", "| op | " + " | ".join(_col_name(j, t) for j, t in cols) + " |",
                  "|---|" + "---|" * len(cols)]
        for op in _ops_in_order(ev):
            row = []
            for j, t in cols:
                c = grid.get((op, backend, j, t))
                row.append("—" if c is None else "**RED**" if c["status"] == "red" else c["status"])
            lines.append(f"| {op} | " + " | ".join(row) + " |")
        lines.append("")
    return lines


def _md_red(ev: dict[str, Any]) -> list[str]:
    reds = red_cells(ev)
    if not reds:
        return []
    lines = ["## Red cells", ""]
    for r in reds:
        lines.append(f"- `{r['tag']}` ({r['evidence_path']}): {r['reason']}")
    return lines + [""]


def _md_details(ev: dict[str, Any]) -> list[str]:
    """Everything after the red cells: provenance, chain, n/a reasons, error table, cross-backend, audit."""
    prov = ev["provenance"]
    lines = ["## Run", "", "| field | value |", "|---|---|",
             f"| contract | `{ev['contract_version']}` sha256 `{ev['contract']['sha256'][:16]}…` |",
             f"| commit | `{prov.get('git_commit')}` dirty={prov.get('git_dirty')} |",
             f"| device | {_md_cell(_device_text(prov['device']))} |",
             f"| software | python {prov['software']['python']}, torch {prov['software']['torch']}, triton {prov['software']['triton']}, "
             f"CUDA {prov['software'].get('torch_cuda') or 'none (CPU build of torch)'} |",
             f"| backends judged | {', '.join(ev['backends']['judged'])} |",
             f"| seed | {ev.get('seed')} |",
             f"| wall time | {ev['wall_time_s']:.1f} s |"]
    resumed = ev.get("resumed_from")
    if resumed:
        lines.append(f"| resumed | {resumed.get('cells_kept')} cells kept from an interrupted run "
                     f"(which had run {resumed.get('wall_time_s') or 0:.1f} s); the wall time above is this run's part |")
    for name, b in sorted(ev["backends"].get("builds", {}).items()):
        how = (f"error: {b['error']}" if "error" in b else
               f"{'loaded from cache; built' if b.get('cached') else 'cold build'} in {b.get('build_seconds', 0.0):.1f} s")
        lines.append(f"| {name} library | {_md_cell(how)} |")
    lines.append("")
    chain = [c for c in ev["cells"] if c["op"] == "chain" and c["judgment"] == "chain_parity"]
    if chain:
        lines += ["## Chain parity", "", "| backend | status | metrics | RL form (generate, then teacher forcing) |",
                  "|---|---|---|---|"]
        for c in chain:
            m = c.get("details", {}).get("metrics", {})
            ms = ", ".join(f"{k}={_fmt(v.get('value') if isinstance(v, dict) else v)}" for k, v in m.items())
            lines.append(f"| {c['backend']} | {c['status']} | {_md_cell(ms or c.get('reason', ''))} | "
                         f"{_md_cell(_rl_form_summary(c.get('details', {}).get('rl_form')))} |")
        lines.append("")
    na = defaultdict(list)
    for c in ev["cells"]:
        if c["status"] in ("n/a", "not provided"):
            na[(c["op"], c["status"], c.get("reason", ""))].append(_col_name(c["judgment"], c.get("transform")))
    if na:
        lines += ["## N/A cells and their reasons", ""]
        for (op, status, reason), cells in na.items():
            lines.append(f"- `{op}` {status} ({', '.join(sorted(set(cells)))}): {reason}")
        lines.append("")
    rows = _error_rows(ev)
    if rows:
        lines += ["## Errors against the FP32 reference", "",
                  "| op | backend | case | tensor | max abs | P99 | P99.9 | atol / rtol | torch_bf16 max abs | pass |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['op']} | {r['backend']} | {r['case']} | `{r['path']}` | {_fmt(r['max_abs'])} | {_fmt(r['p99'])} | "
                         f"{_fmt(r['p999'])} | {r['atol']:g} / {r['rtol']:g} | {_fmt(r['baseline_max_abs'])} | "
                         f"{'yes' if r['passed'] and r['rel_ok'] is not False else '**NO**'} |")
        lines.append("")
    lines += _md_cross_cells(ev)
    cross = ev.get("cross_backend")
    if cross:
        lines += ["## Cross-backend comparison (informational, not a judgment)", "",
                  "| op | case | output | backends | max abs difference | bitwise equal |", "|---|---|---|---|---|---|"]
        for r in cross:
            if "error" in r:
                lines.append(f"| {r['op']} | — | — | — | {_md_cell(r['error'])} | — |")
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
            lines.append(f"| {r['component']} | {r['status']} | {_md_cell('; '.join(r['findings'][:3]) or '—')} |")
        lines.append("")
    lines += [f"Invariance is bitwise on raw bits (+0 ≠ −0), NaN policy `{_nan_policy(ev)}`. Every invariance cell also ran its "
              "negative controls; a control that is not caught turns the cell red.", ""]
    return lines


def _md_cross_cells(ev: dict[str, Any]) -> list[str]:
    """The cross_backend cells: per op (and the chain), the pair, the status and what was measured."""
    cells = [c for c in ev["cells"] if c["judgment"] == "cross_backend"]
    if not cells:
        return []
    lines = ["## Cross-backend bits (judgment `cross_backend`)", "",
             "Every case of each op on both backends of the contract's pair, forward outputs and input gradients, "
             "compared bit for bit; ops the contract does not declare bit-exact are n/a, measured anyway. The "
             "chain's cell scores teacher forcing on one backend against rollout decode on the other, both ways.", "",
             "| op | backends | status | outputs bitwise equal | max abs difference |", "|---|---|---|---|---|"]
    for c in cells:
        d = c.get("details", {})
        pair = " vs ".join(reversed(d.get("backends", []))) or c["backend"]
        if c["op"] == "chain":
            dirs = d.get("directions", {})
            eq = (f"{sum(r['bitwise_equal_tokens'] for r in dirs.values())} of "
                  f"{sum(r['active_tokens'] for r in dirs.values())} token logprobs") if dirs else "—"
            diff = max((r["max_abs_dlogp"] for r in dirs.values()), default=None)
        else:
            eq = f"{d['outputs_bitwise_equal']} of {d['outputs_compared']}" if "outputs_compared" in d else "—"
            diff = d.get("max_abs_difference")
        lines.append(f"| {c['op']} | {pair} | {c['status']} | {eq} | {_fmt(diff) if diff is not None else '—'} |")
    return lines + [""]


def render_markdown(ev: dict[str, Any], plots: list[tuple[str, str, str]] | None = None) -> str:
    """The markdown report; ``plots`` are ``(op, backend, relative path)`` of the PNGs written beside it."""
    lines = _md_head(ev) + _md_matrix(ev) + _md_red(ev) + _md_details(ev)
    if plots:
        lines += ["## Error distribution plots", ""] + [f"![{op} / {b}]({rel})" for op, b, rel in plots] + [""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# plots (matplotlib's object API: no global backend switch, no pyplot state)


def _merge(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """Per tensor path, the histograms ``key`` of every case summed (None when no case has one)."""
    merged: dict[str, dict[str, Any]] = {}
    for r in rows:
        h = r.get(key)
        if not h or not h.get("counts"):
            continue
        m = merged.setdefault(r["path"], {"counts": [0] * len(h["counts"]), "edges": h.get("edges"),
                                          "unit": h.get("unit")})
        if len(m["counts"]) == len(h["counts"]):
            m["counts"] = [a + b for a, b in zip(m["counts"], h["counts"])]
    return merged


def _floor(*hists: dict[str, Any] | None) -> float:
    """The bottom of a log fraction axis: below one element of the largest histogram."""
    return 0.5 / max([1] + [sum(h["counts"]) for h in hists if h])


def _stairs(ax, h: dict[str, Any], colour: str, label: str, filled: bool, floor: float) -> tuple[int, int] | None:
    """Draw a histogram of the layout of :func:`rl_engine.gate.compare.error_histogram` (bin 0 the
    exact zeros, one bin per ``(edges[i-1], edges[i]]``, one overflow bin) on log axes (a tail of a
    few elements stays visible); the exact share goes into the legend (a log axis has no 0).
    Returns the range of non-empty bins."""
    counts, edges = h["counts"], h.get("edges")
    if not edges or len(counts) != len(edges) + 2:
        return None
    total = max(1, sum(counts))
    exact = counts[0] / total
    lows = [edges[0] / (edges[1] / edges[0])] + list(edges)  # the first bin (0, edges[0]] drawn one step wide
    bounds = lows + [edges[-1] * (edges[-1] / edges[-2])]
    values = [max(c / total, floor) for c in counts[1:]]
    ax.stairs(values, bounds, baseline=floor, fill=filled, alpha=0.35 if filled else 1.0, color=colour, linewidth=2,
              label=f"{label} (exact: {exact:.0%}; n={total:,})")
    ax.set_yscale("log")
    ax.set_ylim(floor, 1.5)
    values = [c / total for c in counts[1:]]
    nz = [i for i, v in enumerate(values) if v > 0]
    return (min(nz), max(nz) + 1) if nz else None


def _limits(ax, edges: list[float], spans: list[tuple[int, int] | None], marks: list[float]) -> None:
    lows = [edges[0] / (edges[1] / edges[0])] + list(edges) + [edges[-1] * (edges[-1] / edges[-2])]
    spans = [s for s in spans if s]
    if not spans:
        return
    lo, hi = max(0, min(s[0] for s in spans) - 1), min(len(lows) - 1, max(s[1] for s in spans) + 1)
    left, right = lows[lo], lows[hi]
    for m in marks:
        if m and m > 0 and math.isfinite(m):
            left, right = min(left, m / 3), max(right, m * 3)
    ax.set_xlim(left, right)


def _plot_op(rows: list[dict[str, Any]], title: str) -> bytes | None:
    """Per tensor of one (op, backend): the error distribution in ulps of the output dtype (left)
    and absolute (right), ours and the torch_bf16 baseline against the same FP32 reference, with
    the contract's atol and the relative criterion's bound drawn at their values. PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ours_abs, base_abs = _merge(rows, "histogram"), _merge(rows, "baseline_histogram")
    ours_ulp, base_ulp = _merge(rows, "ulp_histogram"), _merge(rows, "baseline_ulp_histogram")
    paths = list(ours_abs)
    if not paths:
        return None
    by_path = defaultdict(list)
    for r in rows:
        by_path[r["path"]].append(r)
    with_ulp = any(p in ours_ulp for p in paths)
    ncols = 2 if with_ulp else 1
    fig = Figure(figsize=(6.4 * ncols, 4.6 * len(paths) + 0.6), dpi=PLOT_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(paths), ncols, squeeze=False)
    for row, path in zip(axes, paths):
        rs = by_path[path]
        dtype = rs[0].get("dtype") or "output dtype"
        if with_ulp:
            ax = row[0]
            spans = []
            floor = _floor(ours_ulp.get(path), base_ulp.get(path))
            if path in ours_ulp:
                spans.append(_stairs(ax, ours_ulp[path], OURS_COLOUR, rs[0]["backend"], True, floor))
            if path in base_ulp:
                spans.append(_stairs(ax, base_ulp[path], BASELINE_COLOUR, "torch_bf16", False, floor))
            ax.axvline(0.5, color="#616161", linestyle=":", linewidth=1.5, label="0.5 ulp (correctly rounded)")
            ax.set_xscale("log", base=2)
            edges = (ours_ulp.get(path) or base_ulp.get(path))["edges"]
            _limits(ax, edges, spans, [0.5])
            ax.set_xlabel(f"|candidate − FP32 reference| in ulps of {dtype}")
            ax.set_ylabel("fraction of elements (log)")
            ax.set_title(f"{path}: error in ulps")
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=PLOT_FONT_PT - 1, frameon=False)
            ax.grid(True, which="major", alpha=0.3)
        ax = row[-1]
        floor = _floor(ours_abs.get(path), base_abs.get(path))
        spans = [_stairs(ax, ours_abs[path], OURS_COLOUR, rs[0]["backend"], True, floor)]
        if path in base_abs:
            spans.append(_stairs(ax, base_abs[path], BASELINE_COLOUR, "torch_bf16", False, floor))
        atol = _num(rs[0]["atol"])
        marks = []
        if atol and atol > 0:
            ax.axvline(atol, color=BOUND_COLOUR, linestyle="--", linewidth=2,
                       label=f"atol {atol:g} (bound at |ref| = 0; + rtol {rs[0]['rtol']:g}·|ref|)")
            marks.append(atol)
        bounds = [b for b in (_num(r.get("rel_bound")) for r in rs) if b is not None and b > 0 and math.isfinite(b)]
        if bounds:
            tight = min(bounds)
            ax.axvline(tight, color="#6a1b9a", linestyle="-.", linewidth=2,
                       label=f"{_num(rs[0].get('rel_factor')) or 0:g} × torch_bf16 max = {tight:.2e}"
                             + (" (tightest case)" if len(set(bounds)) > 1 else ""))
            marks.append(tight)
        ax.set_xscale("log")
        _limits(ax, ours_abs[path]["edges"], spans, marks)
        ax.set_xlabel("|candidate − FP32 reference| (absolute)")
        ax.set_ylabel("fraction of elements (log)")
        ax.set_title(f"{path}: absolute error")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=PLOT_FONT_PT - 1, frameon=False)
        ax.grid(True, which="major", alpha=0.3)
        for a in row:
            a.tick_params(labelsize=PLOT_FONT_PT)
            a.xaxis.label.set_size(PLOT_FONT_PT + 1)
            a.yaxis.label.set_size(PLOT_FONT_PT + 1)
            a.title.set_size(PLOT_FONT_PT + 1)
    fig.suptitle(title, fontsize=PLOT_FONT_PT + 2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI)
    return buf.getvalue()


_CHAIN_STATS = (("mean_abs_dlogp", "mean"), ("p99_abs_dlogp", "P99"), ("p999_abs_dlogp", "P99.9"),
                ("max_abs_dlogp", "max"))


def _rl_form_summary(rl: Any) -> str:
    """``temperature_1: 4/4 sampled tokens bitwise equal; ...`` of a chain cell's RL form (or why none)."""
    if not isinstance(rl, dict):
        return "not run"
    parts = [f"{name}: {r.get('sampled_tokens', 0) - r.get('differing_logprobs', 0)}/{r.get('sampled_tokens', 0)} "
             f"sampled tokens bitwise equal" for name, r in rl.items() if isinstance(r, dict)]
    return "; ".join(parts) or "not run"


def _plot_chain(cells: list[dict[str, Any]]) -> bytes | None:
    """Chain parity: |dlogp| (teacher forcing vs rollout decode) of ours and of the torch_bf16 chain
    on the same weights and tokens, as the evidence records them (mean, P99, P99.9, max; the
    evidence holds no per-token values), with the contract's thresholds where it has one. Zero (every
    token bitwise equal) is drawn at the axis floor and labelled. PNG bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = []
    for c in cells:
        d = c.get("details", {})
        ours = [_num(d.get(k)) for k, _ in _CHAIN_STATS]
        base = [_num(d.get("baseline_torch_bf16", {}).get(k)) for k, _ in _CHAIN_STATS]
        if any(v is not None for v in ours):
            rows.append((c, ours, base if any(v is not None for v in base) else None))
    if not rows:
        return None
    fig = Figure(figsize=(6.4 * len(rows), 4.6), dpi=PLOT_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(rows), squeeze=False)[0]
    for ax, (c, ours, base) in zip(axes, rows):
        thresholds = c.get("details", {}).get("metrics", {})
        limits = [_num((thresholds.get(k) or {}).get("threshold")) for k, _ in _CHAIN_STATS]
        values = [v for v in ours + (base or []) + limits if v is not None and v > 0 and math.isfinite(v)]
        floor = min(values) / 10 if values else 1e-9
        xs = list(range(len(_CHAIN_STATS)))
        series = [(c["backend"], ours, OURS_COLOUR, -0.2)] + ([("torch_bf16", base, BASELINE_COLOUR, 0.2)] if base else [])
        for label, vals, colour, dx in series:
            # a zero (or missing) value gets no bar (a log axis has no 0), only its label
            heights = [v - floor / 2 if v is not None and v > 0 and math.isfinite(v) else 0.0 for v in vals]
            ax.bar([x + dx for x in xs], heights, width=0.38, bottom=floor / 2, color=colour, alpha=0.8, label=label)
            for x, v in zip(xs, vals):
                if v == 0 or v is None:
                    ax.annotate("0: bitwise\nequal" if v == 0 else "not\nrecorded", (x + dx, floor),
                                textcoords="offset points", xytext=(0, 4), ha="center", fontsize=PLOT_FONT_PT - 1,
                                color=colour)
        for x, (key, _) in zip(xs, _CHAIN_STATS):
            t = _num((thresholds.get(key) or {}).get("threshold"))
            if t is not None and t > 0:
                ax.hlines(t, x - 0.45, x + 0.45, colors=BOUND_COLOUR, linestyles="--", linewidth=2,
                          label="contract threshold (ws1)" if key == "max_abs_dlogp" else None)
        ax.set_yscale("log")
        ax.set_ylim(floor / 2, max(values + [floor]) * 5)
        ax.set_xticks(xs, [name for _, name in _CHAIN_STATS])
        ax.set_xlabel("statistic of |logp(teacher forcing) − logp(rollout decode)| over the active tokens")
        ax.set_ylabel("|dlogp| (nats, log)")
        d = c.get("details", {})
        ax.set_title(f"chain / {c['backend']}: {d.get('active_tokens', '?')} active tokens")
        ax.legend(loc="upper left", fontsize=PLOT_FONT_PT - 1)
        ax.grid(True, axis="y", alpha=0.3)
        ax.tick_params(labelsize=PLOT_FONT_PT)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=PLOT_DPI)
    return buf.getvalue()


def _plots_by_op(ev: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    by_op: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in _error_rows(ev):
        by_op[(r["op"], r["backend"])].append(r)
    return by_op


def _plot_title(op: str, backend: str) -> str:
    return f"{op} / {backend}: error against the FP32 reference"


def _render_all(jobs: list[tuple[list[dict[str, Any]], str]]) -> list[bytes | None]:
    """``_plot_op`` of every job, in order: in worker processes (spawned, so a parent that holds a
    CUDA context is never forked) when there are at least :data:`PLOT_PROCESS_MIN` jobs and more
    than one CPU is available, else in this process. A figure's bytes do not depend on where it
    was drawn."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = min(cpus, len(jobs))
    if len(jobs) < PLOT_PROCESS_MIN or workers < 2:
        return [_plot_op(rows, title) for rows, title in jobs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_plot_op, *zip(*jobs)))


def write_plots(ev: dict[str, Any], out_dir: Path) -> list[tuple[str, str, str, bytes]]:
    """One PNG per (op, backend) under ``out_dir/plots/`` (each written atomically), named from the
    evidence's op and backend names through :func:`rl_engine.cli.io.safe_output_path` (a crafted
    name cannot leave the folder). Returns ``(op, backend, relative path, png bytes)``."""
    from rl_engine.cli.io import safe_output_path

    plots = []
    folder = out_dir / "plots"
    by_op = _plots_by_op(ev)
    targets = [safe_output_path(folder, f"{op}-{backend}.png") for op, backend in by_op]  # before any write
    pngs = _render_all([(rs, _plot_title(op, backend)) for (op, backend), rs in by_op.items()])
    for (op, backend), target, png in zip(by_op, targets, pngs):
        if png:
            write_bytes_atomic(target, png, prefix=".plot-")
            plots.append((op, backend, f"plots/{target.name}", png))
    chain = [c for c in ev["cells"] if c["op"] == "chain" and c["judgment"] == "chain_parity"]
    png = _plot_chain(chain) if chain else None
    if png:
        target = safe_output_path(folder, "chain-parity.png")
        write_bytes_atomic(target, png, prefix=".plot-")
        plots.append(("chain", "parity", f"plots/{target.name}", png))
    if folder.is_dir():  # plots of an earlier run in this folder would sit beside a report that no longer shows them
        keep = {rel.split("/", 1)[1] for _, _, rel, _ in plots}
        for old in folder.glob("*.png"):
            if old.name not in keep:
                old.unlink()
    return plots


# ------------------------------------------------------------------------------------------------
# HTML


_STATUS_CLASS = {"green": "green", "red": "red", "n/a": "na", "not provided": "np"}


def _template():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).resolve().parent / "templates")),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template("report.html.j2")


def _markdown_to_html(text: str) -> str:
    from markdown_it import MarkdownIt

    # raw HTML in the text (a reason quoting '<tensor>') is escaped, not passed through
    return MarkdownIt("commonmark", {"html": False}).enable("table").render(text)


def render_html(ev: dict[str, Any], plots: list[tuple[str, str, bytes]] | None = None) -> str:
    """The self-contained HTML report. ``plots`` are ``(op, backend, png bytes)``; when None they
    are drawn here (in memory, nothing written)."""
    if plots is None:
        plots = [(op, b, png) for (op, b), rs in _plots_by_op(ev).items() if (png := _plot_op(rs, _plot_title(op, b)))]
        chain = [c for c in ev["cells"] if c["op"] == "chain" and c["judgment"] == "chain_parity"]
        if chain and (png := _plot_chain(chain)):
            plots.append(("chain", "parity", png))
    grid, cols = _grid(ev), _columns(ev)
    red = red_cells(ev)
    anchors = {id(r["cell"]): r["anchor"] for r in red}
    matrices = []
    for backend in ev["backends"]["judged"]:
        rows = []
        for op in _ops_in_order(ev):
            cells = []
            for j, t in cols:
                c = grid.get((op, backend, j, t))
                cells.append(None if c is None else {"status": c["status"], "cls": _STATUS_CLASS.get(c["status"], "na"),
                                                     "reason": c.get("reason") or "", "anchor": anchors.get(id(c))})
            rows.append({"op": op, "cells": cells})
        matrices.append({"backend": backend, "rows": rows})
    v = verdict(ev)
    prov = ev["provenance"]
    return _template().render(
        ev=ev, verdict=v, verdict_cls=v["word"].lower(), summary=ev["summary"], statuses=STATUSES,
        status_class=_STATUS_CLASS, columns=[_col_name(j, t) for j, t in cols], matrices=matrices,
        red=red, root_cause=ev.get("root_cause"), device=_device_text(prov["device"]),
        commit=prov.get("git_commit"), dirty=prov.get("git_dirty"),
        plots=[{"title": f"{op} / {b}", "alt": f"{op} / {b} error distribution",
                "src": "data:image/png;base64," + base64.b64encode(png).decode()} for op, b, png in plots],
        details_html=_markdown_to_html("\n".join(_md_details(ev))))


# ------------------------------------------------------------------------------------------------
# writing


def recount(ev: dict[str, Any]) -> dict[str, Any]:
    """The evidence with its summary and root cause recomputed from its cells (a report never
    trusts a stored summary: a hand-edited file could disagree with its own cells)."""
    from rl_engine.gate.runner import root_cause

    summary = {"green": 0, "red": 0, "n/a": 0, "not provided": 0}
    for c in ev["cells"]:
        summary[c["status"]] = summary.get(c["status"], 0) + 1
    return {**ev, "summary": summary, "root_cause": root_cause(ev["cells"])}


def write_reports(ev: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write ``plots/*.png``, ``report.md`` and ``report.html`` into ``out_dir``, each through a
    temporary file and ``os.replace`` (a crash never leaves a torn report)."""
    ev = recount(ev)
    plots = write_plots(ev, out_dir)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    write_text_atomic(md_path, render_markdown(ev, [(op, b, rel) for op, b, rel, _ in plots]), prefix=".report-")
    write_text_atomic(html_path, render_html(ev, [(op, b, png) for op, b, _, png in plots]), prefix=".report-")
    return md_path, html_path
