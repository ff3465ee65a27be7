"""Write the benchmark outputs: ``bench.json`` (atomic, schema-checked), ``bench.md``, ``bench.png``."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from rl_engine.errors import RLEngineError
from rl_engine.jsonio import schema_problem, strict_json, write_text_atomic

SCHEMA = Path(__file__).resolve().parent / "bench.schema.json"


def _clean(obj: Any) -> Any:
    """Strict JSON: NaN / inf become strings (never expected, but never a torn or invalid file)."""
    return strict_json(obj)


def validate(doc: dict[str, Any]) -> None:
    """Raise RLEngineError naming the first field that breaks ``bench.schema.json``."""
    problem = schema_problem(json.loads(SCHEMA.read_text()), doc)
    if problem:
        raise RLEngineError(f"bench.json does not match its schema {problem}")


def _atomic_text(path: Path, text: str) -> None:
    write_text_atomic(path, text)


def write_json(path: Path, doc: dict[str, Any], *, check: bool = True) -> None:
    """Write through a temporary file and ``os.replace`` (never a torn file); validate first
    unless ``check`` is False (the progress writes of a running benchmark)."""
    data = _clean(doc)
    if check:
        validate(data)
    _atomic_text(path, json.dumps(data, indent=1, allow_nan=False) + "\n")


def load(path: Path) -> dict[str, Any]:
    data = json.loads(Path(path).read_text())
    validate(data)
    return data


# ------------------------------------------------------------------------------------------------
# markdown


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "—"
    if x == 0:
        return "0"
    mag = abs(x)
    if mag >= 100:
        return f"{x:.0f}"
    if mag >= 1:
        return f"{x:.{max(digits - 1, 0)}f}".rstrip("0").rstrip(".") if mag < 10 else f"{x:.1f}"
    return f"{x:.{digits}g}"


def miss_text(row: dict[str, Any]) -> str:
    """``meets`` / ``MISSES by ...`` / ``—`` for a row."""
    if row["target"] is None:
        return "—"
    if row["meets_target"] is None:
        return "not judged"
    if row["meets_target"]:
        return "meets"
    t, r = row["target"], row["ratio"]
    if row["target_sense"] == ">=":
        return f"**MISSES** by {t - r:.3f}x ({(t - r) / t * 100:.0f} % below target)"
    return f"**MISSES** by {r - t:.3f}x ({(r - t) / t * 100:.0f} % over target)"


def _status(row: dict[str, Any], who: str) -> str:
    status = row["status"] if who == "ours" else row["baseline_status"]
    note = row["note"] if who == "ours" else row["baseline_note"]
    if status in ("measured", "dry-run") and not note:
        return ""
    return f"{status}" + (f": {note}" if note else "")


def _spread_text(sp: dict[str, Any] | None, mem: dict[str, Any] | None = None) -> str:
    if mem:
        return f"peak +{mem['peak_extra_gib']:.4g} GiB, of which returned grads {mem['result_gib']:.4g} GiB"
    if not sp:
        return "—"
    return f"{sp['median_ms']:.4g} ms ({sp['p20_ms']:.4g}–{sp['p80_ms']:.4g})"


def render_md(doc: dict[str, Any]) -> str:
    prov = doc["provenance"]
    cfg = doc["config"]
    dev = prov.get("device", {})
    sw = prov.get("software", {})
    peaks = doc.get("peaks") or {}
    lines = ["# rl-engine bench", ""]
    if doc["dry_run"]:
        lines += ["**DRY RUN**: every row's inputs were built at tiny shapes and every callable ran once; "
                  "nothing was timed, so every value is empty. The shapes below are the real ones.", ""]
    if not doc["complete"]:
        lines += ["**INCOMPLETE**: the run stopped before the end; the rows below are the finished ones.", ""]
    dirty = " (dirty tree)" if prov.get("git_dirty") else ""
    lines += [
        f"- commit `{prov.get('git_commit')}`{dirty}; {prov.get('timestamp_utc')}",
        f"- device: {dev.get('name')} (compute capability {dev.get('compute_capability')}, "
        f"{dev.get('sm_count')} SMs); torch {sw.get('torch')}, triton {sw.get('triton')}, CUDA {sw.get('torch_cuda')}",
        f"- backends measured: {', '.join(cfg['backends']) or 'none'}"
        + "".join(f"; **{b} left out**: {why}" for b, why in cfg["skipped_backends"].items()),
        f"- tokens {cfg['tokens']}{' (quick)' if cfg['quick'] else ''}; warm-up {cfg['warmup_ms']} ms, "
        f"repetitions {cfg['rep_ms']} ms; seed {cfg['seed']}",
        f"- timing: {cfg['timing_method']}",
    ]
    if peaks.get("error"):
        lines.append(f"- peaks: measurement failed ({peaks['error']}); rows against a peak have no baseline value")
    if peaks.get("copy_gbps") is not None:
        end = peaks.get("end") or {}
        lines.append(f"- peaks measured in this run: copy {peaks['copy_gbps']:.0f} GB/s "
                     f"({peaks['copy_bytes'] / 2**30:.0f} GiB read + written), cuBLAS BF16 "
                     f"{peaks['cublas_tflops']:.0f} TFLOP/s (matmul {peaks['matmul_mnk']}); at the end: "
                     f"{_num(end.get('copy_gbps'))} GB/s, {_num(end.get('cublas_tflops'))} TFLOP/s")
    if doc.get("wall_time_s") is not None:
        lines.append(f"- wall time {doc['wall_time_s']:.1f} s")
    lines.append("")
    rows = doc["rows"]
    judged = [r for r in rows if r["meets_target"] is not None]
    missed = [r for r in judged if not r["meets_target"]]
    lines += ["## Targets (docs/decisions.md \"Performance targets\")", ""]
    if not judged:
        lines += ["No target judged in this run" + (" (dry run)." if doc["dry_run"] else "."), ""]
    else:
        lines += [f"{len(judged)} rows judged against a target: {len(judged) - len(missed)} meet it, "
                  f"{len(missed)} miss it.", ""]
        for r in missed:
            lines.append(f"- {r['op']} {r['variant']} `{r['shape']}` {r['backend']}: {_num(r['ratio'])}x "
                         f"{r['baseline']} (target {r['target_sense']} {_num(r['target'])}x) — {miss_text(r)}")
        if missed:
            lines.append("")
    lines += ["Ratios are ours / baseline in the row's metric: for TFLOP/s, GB/s and tokens/s higher is better, "
              "for ms and GiB lower is better. \"% of peak\" is ours against the peak measured in this run (GB/s vs "
              "copy, TFLOP/s vs cuBLAS). Memory rows count scratch: peak allocated above the start minus the "
              "gradients the call returns.", ""]
    ops: list[str] = []
    for r in rows:
        if r["op"] not in ops:
            ops.append(r["op"])
    for op in ops:
        lines += [f"## {op}", "",
                  "| variant | shape | backend | metric | ours | time median (p20–p80) or memory | baseline | baseline value "
                  "| ratio | target | verdict | % of peak | notes |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in (x for x in rows if x["op"] == op):
            target = f"{r['target_sense']} {_num(r['target'])}x" if r["target"] is not None else "—"
            frac = f"{r['fraction_of_peak'] * 100:.0f} %" if r["fraction_of_peak"] is not None else "—"
            notes = "; ".join(x for x in (_status(r, "ours"), ("baseline " + _status(r, "base")) if _status(r, "base") else "") if x)
            lines.append(
                f"| {r['variant']} | `{r['shape']}` | {r['backend']} | {r['metric']} | {_num(r['value'])} | "
                f"{_spread_text(r['spread'], r['memory'])} | {r['baseline']} | {_num(r['baseline_value'])} | "
                f"{_num(r['ratio'])} | {target} | {miss_text(r)} | {frac} | {notes.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def write_md(path: Path, doc: dict[str, Any]) -> None:
    _atomic_text(path, render_md(doc))


# ------------------------------------------------------------------------------------------------
# plot


def write_png(path: Path, doc: dict[str, Any]) -> bool:
    """Ratio of the primary comparison per op and shape, one panel per op, one bar per backend,
    the target drawn where one applies. Returns False (and writes nothing) without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    rows = [r for r in doc["rows"] if r["primary"]]
    panels: list[tuple[str, str, str]] = []
    for r in rows:
        key = (r["op"], r["baseline"], r["metric"])
        if key not in panels:
            panels.append(key)
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    ncols = 2
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig = Figure(figsize=(7 * ncols, 3.0 * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]
    for ax, (op, baseline, metric) in zip(axes, panels):
        op_rows = [r for r in rows if (r["op"], r["baseline"], r["metric"]) == (op, baseline, metric)]
        groups = list(dict.fromkeys((r["variant"], r["shape"]) for r in op_rows))
        several = len({v for v, _ in groups}) > 1
        width = 0.8 / max(1, len(backends))
        tops = [1.0]
        labelled: set[str] = set()
        for gi, g in enumerate(groups):
            for bi, backend in enumerate(backends):
                r = next((x for x in op_rows if (x["variant"], x["shape"]) == g and x["backend"] == backend), None)
                if r is None:
                    continue
                x = gi - 0.4 + width * (bi + 0.5)
                ax.bar(x, r["ratio"] or 0.0, width, color=colours[bi % len(colours)],
                       label=None if backend in labelled else backend)
                labelled.add(backend)
                tops.append(r["ratio"] or 0.0)
                if r["target"] is not None:
                    ax.hlines(r["target"], x - width / 2, x + width / 2, colors="red", linewidth=2,
                              label=None if "target" in labelled else "target")
                    labelled.add("target")
                    tops.append(r["target"])
        sense = op_rows[0]["ratio_sense"]
        ax.set_title(f"{op} ({metric}) vs {baseline}", fontsize=9)
        ax.set_ylabel(f"ours / baseline\n({sense})", fontsize=8)
        ax.set_ylim(0, max(tops) * 1.15)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([(f"{v}\n" if several else "") + s.split("-")[0] for v, s in groups],
                           rotation=45 if several else 0, ha="right" if several else "center", fontsize=6)
        ax.axhline(1.0, color="grey", linewidth=0.5, linestyle=":")
        if not any(r["ratio"] is not None for r in op_rows):
            ax.text(0.5, 0.5, "no timings (" + ("dry run" if doc["dry_run"] else "not measured") + ")",
                    transform=ax.transAxes, ha="center", va="center", fontsize=9, color="grey")
        ax.legend(fontsize=7, loc="best")
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("rl-engine bench: ours / baseline" + (" (DRY RUN)" if doc["dry_run"] else ""), fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return True
