"""Plan and run the benchmark matrix; build the rows of ``bench.json``.

One row per (case, backend, baseline): ``value`` is ours in the case's metric, ``baseline_value``
the baseline's (an implementation timed in the same process right beside ours, or a peak measured
in the same run), ``ratio = value / baseline_value``, and ``target`` / ``meets_target`` where
a target is set for that row (:mod:`rl_engine.bench.targets`). Ours is measured once per
(case, backend) and each baseline once per case, so every backend's row divides by the same
baseline measurement.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_engine.bench import attention, chain, gemm, logprob, norm
from rl_engine.bench.common import HIGHER_IS_BETTER, QWEN3_8B, TINY, Case, Pool, tiny_tokens
from rl_engine.bench.targets import TARGETS, target_for
from rl_engine.errors import RLEngineError

SCHEMA_VERSION = "rl_engine.bench/1"
FAMILIES: dict[str, Any] = {"gemm": gemm, "attention": attention, "norm": norm, "logprob": logprob, "chain": chain}
BENCH_OPS: dict[str, str] = {op: fam for fam, mod in FAMILIES.items() for op in mod.OPS}
"""Bench item -> family, in run order."""
ALIASES = {"attention": attention.OPS, **{fam: mod.OPS for fam, mod in FAMILIES.items()}}
BENCH_BACKENDS = ("triton_cuda_bf16", "cuda_bf16")
DEFAULT_TOKENS = (1, 16, 128, 1024, 4096, 8192)
QUICK_TOKENS = (1, 16, 1024, 8192)
DEFAULT_WARMUP_MS, DEFAULT_REP_MS = 25.0, 100.0
QUICK_WARMUP_MS, QUICK_REP_MS = 10.0, 40.0
TIMING_METHOD = ("triton.testing.do_bench: untimed first call, warm-up, then per-call CUDA-event times with the "
                 "L2 cache flushed (256 MB write) before every call; median reported, p20/p80 as spread")


@dataclass
class BenchConfig:
    ops: list[str]
    backends: list[str]
    """Backends whose rows are measured."""
    tokens: list[int]
    out_dir: Path
    quick: bool = False
    dry_run: bool = False
    warmup_ms: float = DEFAULT_WARMUP_MS
    rep_ms: float = DEFAULT_REP_MS
    seed: int = 0
    time_budget_s: float | None = None
    requested_backend: str = "all"
    skipped_backends: dict[str, str] = field(default_factory=dict)
    """Backends asked for (or implied by ``all``) that cannot run here: name -> reason (rows kept, status skipped)."""


def resolve_ops(names: list[str] | None) -> list[str]:
    """Bench items from names: items, families (gemm, attention, norm, logprob, chain) or ``all``."""
    if not names:
        return list(BENCH_OPS)
    chosen: list[str] = []
    for name in names:
        if name == "all":
            items = tuple(BENCH_OPS)
        elif name in BENCH_OPS:
            items = (name,)
        elif name in ALIASES:
            items = ALIASES[name]
        else:
            valid = ", ".join(list(BENCH_OPS) + sorted(set(ALIASES) - set(BENCH_OPS)))
            raise RLEngineError(f"unknown bench op {name!r}; valid: {valid}, all")
        chosen += [i for i in items if i not in chosen]
    return [op for op in BENCH_OPS if op in chosen]  # run order


def check_backend_name(name: str) -> list[str]:
    """The backends ``name`` asks for (``all``, one name or a comma list); unknown names raise."""
    if name == "all":
        return list(BENCH_BACKENDS)
    wanted = list(dict.fromkeys(b.strip() for b in name.split(",") if b.strip()))
    bad = [b for b in wanted if b not in BENCH_BACKENDS]
    if bad or not wanted:
        raise RLEngineError(f"unknown bench backend {', '.join(bad) or repr(name)}; valid: {', '.join(BENCH_BACKENDS)}, all")
    return wanted


def resolve_backends(name: str, dry_run: bool) -> tuple[list[str], dict[str, str]]:
    """``(backends to measure, {left-out backend: reason})``.

    A named backend that cannot run here raises (exit 2), except in a dry run, where it is kept
    as skipped rows with the reason; ``all`` keeps the unavailable ones as skipped rows."""
    from rl_engine.backends.registry import availability
    from rl_engine.errors import BackendUnavailable

    wanted = check_backend_name(name)
    run, skipped = [], {}
    for b in wanted:
        ok, why = availability(b)
        if ok and dry_run and b == "cuda_bf16" and not torch.cuda.is_available():
            ok, why = False, "no CUDA GPU"
        if ok:
            run.append(b)
        elif name != "all" and not dry_run:
            raise BackendUnavailable(f"backend {b} cannot run here: {why}")
        else:
            skipped[b] = f"{'dry run: ' if dry_run else ''}{why}"
    return run, skipped


def plan(cfg: BenchConfig) -> list[Case]:
    out: list[Case] = []
    for op in cfg.ops:
        out += FAMILIES[BENCH_OPS[op]].cases(op, list(cfg.tokens), cfg.quick)
    return out


# ------------------------------------------------------------------------------------------------
# measuring


@dataclass
class Result:
    status: str
    """measured | dry-run | skipped | not installed | error"""
    timing: Any = None
    memory: Any = None
    note: str | None = None


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]


_IMPORTS: dict[str, str | None] = {}


def _import_problem(name: str) -> str | None:
    """``None`` when module ``name`` imports; ``"not installed"`` when it is absent; otherwise the
    import error (a broken install is an error row, not "not installed")."""
    if name not in _IMPORTS:
        import importlib

        try:
            importlib.import_module(name)
            _IMPORTS[name] = None
        except ModuleNotFoundError as exc:
            _IMPORTS[name] = "not installed" if exc.name and name.startswith(exc.name) else _short(exc)
        except Exception as exc:  # noqa: BLE001 - any failure to import is reported in the row
            _IMPORTS[name] = _short(exc)
    return _IMPORTS[name]


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Runner:
    def __init__(self, cfg: BenchConfig, log: Callable[[str], None]):
        self.cfg = cfg
        self.log = log
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.broken: dict[str, str] = {}
        self.dry_cache: dict[tuple, Result] = {}

    def measure(self, make: Callable[[], Any], case: Case, dry_key: tuple | None = None) -> Result:
        """Make the callable and measure it (or, in a dry run, call it once)."""
        if self.cfg.dry_run and dry_key is not None and dry_key in self.dry_cache:
            return self.dry_cache[dry_key]
        note = None
        try:
            made = make()
            fn, note = made if isinstance(made, tuple) else (made, None)
            if self.cfg.dry_run:
                from rl_engine.bench.timing import run_once

                run_once(fn)
                res = Result("dry-run", note=note)
            elif case.measure == "once":
                from rl_engine.bench.timing import time_once

                res = Result("measured", timing=time_once(fn), note=note)
            elif case.measure == "calls":
                from rl_engine.bench.timing import time_calls

                res = Result("measured", timing=time_calls(fn), note=note)
            elif case.measure == "memory":
                from rl_engine.bench.timing import memory_fn

                res = Result("measured", memory=memory_fn(fn), note=note)
            else:
                from rl_engine.bench.timing import time_fn

                res = Result("measured", timing=time_fn(fn, self.cfg.warmup_ms, self.cfg.rep_ms), note=note)
        except Exception as exc:  # one failing row must not end the run
            if isinstance(exc, torch.cuda.OutOfMemoryError):
                _free_memory()
            res = Result("error", note=_short(exc) if note is None else f"{note}; {_short(exc)}")
        if self.cfg.dry_run and dry_key is not None:
            self.dry_cache[dry_key] = res
        return res

    def run_case(self, case: Case, pool: Pool, peaks: dict[str, Any]) -> list[dict[str, Any]]:
        cfg = self.cfg
        real = case.sizes(QWEN3_8B, case.tokens)
        dims = TINY if cfg.dry_run else QWEN3_8B
        used = case.sizes(TINY, tiny_tokens(case.tokens)) if cfg.dry_run else real
        flops, nbytes = case.count(real)
        ours: dict[str, Result] = {}
        base: dict[str, Result] = {}
        try:
            state = case.build(used, dims, pool)
        except Exception as exc:
            _free_memory()
            err = Result("error", note=f"building inputs failed: {_short(exc)}")
            state = None
        dry_shape = case.label(used)
        for backend in _all_backends(cfg):
            if backend in cfg.skipped_backends:
                ours[backend] = Result("skipped", note=cfg.skipped_backends[backend])
            elif state is None:
                ours[backend] = err
            elif backend in self.broken:
                ours[backend] = Result("error", note=f"backend failed earlier in this run: {self.broken[backend]}")
            else:
                res = self.measure(lambda b=backend: case.ours(b, state), case, (case.op, case.variant, dry_shape, backend))
                if res.status == "error" and _backend_broken(res.note):
                    self.broken[backend] = res.note or ""
                ours[backend] = res
        for b in case.baselines:
            if b.peak is not None:
                base[b.label] = Result("dry-run" if cfg.dry_run else "measured", note=None)
            elif b.requires and _import_problem(b.requires) == "not installed":
                base[b.label] = Result("not installed", note=f"{b.requires} not installed")
            elif b.requires and _import_problem(b.requires) is not None:
                base[b.label] = Result("error", note=f"import {b.requires} failed: {_import_problem(b.requires)}")
            elif b.needs_cuda and self.device.type != "cuda":
                base[b.label] = Result("skipped", note="needs a CUDA GPU")
            elif state is None:
                base[b.label] = err
            else:
                base[b.label] = self.measure(lambda b=b: b.make(state), case, (case.op, case.variant, dry_shape, b.label))
        del state
        if case.family == "chain":  # whole-model state (weights' gradients, HF models, graphs, caches): gone now
            _free_memory()
        return [_row(case, backend, ours[backend], b, base[b.label], real, dry_shape if cfg.dry_run else None,
                     flops, nbytes, peaks)
                for backend in _all_backends(cfg) for b in case.baselines]


def _all_backends(cfg: BenchConfig) -> list[str]:
    return [b for b in BENCH_BACKENDS if b in cfg.backends or b in cfg.skipped_backends]


def _backend_broken(note: str | None) -> bool:
    """A failed build of the CUDA library would fail (slowly) every later row of that backend too."""
    return bool(note) and note.startswith("CudaBuildError")


def _value(case: Case, res: Result, flops: int, nbytes: int) -> float | None:
    if res.timing is not None:
        return _from_ms(case.metric, res.timing.median_ms, flops, nbytes, case.tokens)
    if res.memory is not None:
        return res.memory.scratch_bytes / 2**30
    return None


def _from_ms(metric: str, ms: float, flops: int, nbytes: int, tokens: int = 0) -> float | None:
    """A time of ``ms`` milliseconds in ``metric``: TFLOP/s of ``flops``, GB/s of ``nbytes``,
    tokens/s of ``tokens`` (the case's real token count), or the time itself (``ms``)."""
    if ms <= 0:
        return None
    if metric == "TFLOP/s":
        return flops / ms / 1e9
    if metric == "GB/s":
        return nbytes / ms / 1e6
    if metric == "tokens/s":
        return tokens / ms * 1e3
    return ms


def _spread(case: Case, res: Result, flops: int, nbytes: int) -> dict[str, Any] | None:
    if res.timing is not None:
        t = res.timing
        a = _from_ms(case.metric, t.p80_ms, flops, nbytes, case.tokens)
        b = _from_ms(case.metric, t.p20_ms, flops, nbytes, case.tokens)
        lo, hi = (min(a, b), max(a, b)) if a is not None and b is not None else (None, None)
        return {**t.as_dict(), "value_low": lo, "value_high": hi}
    return None


def _achieved(res: Result, flops: int, nbytes: int) -> dict[str, float] | None:
    if res.timing is None or res.timing.median_ms <= 0:
        return None
    ms = res.timing.median_ms
    return {"tflops": flops / ms / 1e9, "gbps": nbytes / ms / 1e6}


def _peak_fraction(metric: str, value: float | None, peaks: dict[str, Any]) -> float | None:
    ref = {"GB/s": peaks.get("copy_gbps"), "TFLOP/s": peaks.get("cublas_tflops")}.get(metric)
    if value is None or not ref:
        return None
    return value / ref


def _row(case: Case, backend: str, ours: Result, b, base: Result, real: dict, dry_shape: str | None,
         flops: int, nbytes: int, peaks: dict[str, Any]) -> dict[str, Any]:
    value = _value(case, ours, flops, nbytes)
    if b.peak is not None:
        bval = peaks.get("copy_gbps" if b.peak == "copy" else "cublas_tflops")
        bkind = "peak"
    else:
        bval = _value(case, base, flops, nbytes)
        bkind = "implementation"
    ratio = value / bval if value is not None and bval else None
    tgt = target_for(b.target, case.tokens)
    meets = tgt.met(ratio) if tgt is not None and ratio is not None else None
    higher = HIGHER_IS_BETTER[case.metric]
    return {
        "op": case.op, "kernel_op": case.kernel_op, "family": case.family, "variant": case.variant,
        "tokens": case.tokens, "backend": backend, "shape": case.label(real), "sizes": real,
        "dry_run_shape": dry_shape, "metric": case.metric, "value": value,
        "spread": _spread(case, ours, flops, nbytes), "status": ours.status, "note": ours.note,
        "baseline": b.label, "baseline_kind": bkind, "baseline_value": bval,
        "baseline_spread": _spread(case, base, flops, nbytes) if bkind == "implementation" else None,
        "baseline_status": base.status, "baseline_note": base.note,
        "ratio": ratio, "ratio_sense": "higher is better" if higher else "lower is better",
        "target": tgt.target_ratio if tgt else None, "target_sense": tgt.sense if tgt else None,
        "target_key": tgt.key if tgt else None, "meets_target": meets, "primary": b.primary,
        "fraction_of_peak": _peak_fraction(case.metric, value, peaks),
        "baseline_fraction_of_peak": _peak_fraction(case.metric, bval, peaks) if bkind == "implementation" else None,
        "achieved": _achieved(ours, flops, nbytes), "baseline_achieved": _achieved(base, flops, nbytes),
        "memory": ours.memory.as_dict() if ours.memory is not None else None,
        "baseline_memory": base.memory.as_dict() if base.memory is not None else None,
        "flops": flops, "bytes": nbytes,
    }


# ------------------------------------------------------------------------------------------------
# the run


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    with_target = [r for r in rows if r["target"] is not None]
    judged = [r for r in with_target if r["meets_target"] is not None]
    missed = [r for r in judged if not r["meets_target"]]
    return {
        "rows": len(rows),
        "measured": sum(r["status"] == "measured" for r in rows),
        "errors": sum(r["status"] == "error" for r in rows),
        "baseline_errors": sum(r["baseline_status"] == "error" for r in rows),
        "with_target": len(with_target),
        "targets_judged": len(judged),
        "targets_met": len(judged) - len(missed),
        "targets_missed": len(missed),
        "missed": [f"{r['op']} {r['variant']} {r['shape']} {r['backend']} vs {r['baseline']}: "
                   f"{r['ratio']:.3f} (target {r['target_sense']} {r['target']:.3f})" for r in missed],
    }


def new_document(cfg: BenchConfig) -> dict[str, Any]:
    from rl_engine import provenance

    return {
        "schema_version": SCHEMA_VERSION,
        "complete": False,
        "dry_run": cfg.dry_run,
        "config": {
            "ops": list(cfg.ops), "requested_backend": cfg.requested_backend, "backends": list(cfg.backends),
            "skipped_backends": dict(cfg.skipped_backends), "tokens": list(cfg.tokens), "quick": cfg.quick,
            "warmup_ms": cfg.warmup_ms, "rep_ms": cfg.rep_ms, "seed": cfg.seed, "time_budget_s": cfg.time_budget_s,
            "dims": QWEN3_8B.__dict__, "dry_run_dims": TINY.__dict__ if cfg.dry_run else None,
            "timing_method": TIMING_METHOD,
        },
        "provenance": provenance.collect(),
        "peaks": None,
        "targets": [t.as_dict() for t in TARGETS.values()],
        "rows": [],
        "summary": None,
        "wall_time_s": None,
    }


def run_bench(cfg: BenchConfig, *, log: Callable[[str], None] | None = None,
              on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run every planned case; return the ``bench.json`` document (``complete: True``).

    ``on_progress(doc)`` is called after each case with the partial document (the CLI writes it,
    so an interrupted run leaves every finished row on disk)."""
    from rl_engine.bench.timing import measure_peaks

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    t0 = time.monotonic()
    doc = new_document(cfg)
    runner = _Runner(cfg, log)
    try:
        peaks = measure_peaks(runner.device, cfg.warmup_ms, cfg.rep_ms, cfg.dry_run)
    except Exception as exc:  # the rows still run; those against a peak get no baseline value
        peaks = {"copy_gbps": None, "cublas_tflops": None, "copy_bytes": 0, "matmul_flops": 0, "error": _short(exc)}
        log(f"peaks: measurement failed: {_short(exc)}")
    doc["peaks"] = dict(peaks)
    if peaks.get("copy_gbps") is not None:
        log(f"peaks: copy {peaks['copy_gbps']:.0f} GB/s, cuBLAS BF16 {peaks['cublas_tflops']:.0f} TFLOP/s")
    cases = plan(cfg)
    pool = Pool(runner.device, cfg.seed)
    family = None
    for i, case in enumerate(cases, 1):
        if case.family != family:
            pool.clear()
            _free_memory()
            family = case.family
        elapsed = time.monotonic() - t0
        if cfg.time_budget_s is not None and elapsed > cfg.time_budget_s:
            rows = _budget_rows(case, cfg, peaks)
        else:
            c0 = time.monotonic()
            rows = runner.run_case(case, pool, peaks)
            log(f"[{i}/{len(cases)}] {case.op} {case.variant} T={case.tokens}: {_brief(rows)} ({time.monotonic() - c0:.1f}s)")
        doc["rows"] += rows
        if on_progress is not None:
            doc["wall_time_s"] = time.monotonic() - t0
            on_progress(doc)
    pool.clear()
    _free_memory()
    if not cfg.dry_run:
        try:
            end = measure_peaks(runner.device, cfg.warmup_ms, cfg.rep_ms, False)
            doc["peaks"]["end"] = {k: end[k] for k in ("copy_gbps", "cublas_tflops")}
        except Exception as exc:
            doc["peaks"]["end"] = {"error": _short(exc)}
    doc["summary"] = summarize(doc["rows"])
    doc["complete"] = True
    doc["wall_time_s"] = time.monotonic() - t0
    return doc


def _budget_rows(case: Case, cfg: BenchConfig, peaks: dict[str, Any]) -> list[dict[str, Any]]:
    real = case.sizes(QWEN3_8B, case.tokens)
    flops, nbytes = case.count(real)
    note = f"time budget of {cfg.time_budget_s:.0f} s spent before this case"
    res = Result("skipped", note=note)
    return [_row(case, backend, res, b, Result("skipped", note=note), real, None, flops, nbytes, peaks)
            for backend in _all_backends(cfg) for b in case.baselines]


def _brief(rows: list[dict[str, Any]]) -> str:
    parts = []
    for r in rows:
        if not r["primary"]:
            continue
        if r["status"] != "measured":
            parts.append(f"{r['backend']} {r['status']}")
        elif r["ratio"] is not None:
            parts.append(f"{r['backend']} {r['value']:.4g} {r['metric']} = {r['ratio']:.2f}x")
        else:
            parts.append(f"{r['backend']} {r['value']:.4g} {r['metric']}")
    return "; ".join(parts)
