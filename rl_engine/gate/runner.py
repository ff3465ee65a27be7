"""The gate: ops x backends x judgments x workload -> cells -> evidence.

Every cell is ``green``, ``red`` or ``n/a`` (only where the op spec declares it, with the reason).
A cell that raises is ``red`` with the error as its reason, and the run goes on. Evidence is
rewritten atomically as cells finish (at most once a second, and when the run ends or is
interrupted; ``complete: false`` until the end).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rl_engine import provenance
from rl_engine.backends.registry import external_backend
from rl_engine.constants import OPS
from rl_engine.contract import Contract
from rl_engine.errors import RLEngineError
from rl_engine.gate import evidence as evidence_io
from rl_engine.gate import judgments as J
from rl_engine.gate.plan import (DEFAULT_JUDGMENTS, JUDGMENTS, CellKey, GateConfig,  # noqa: F401 (re-exported)
                                 plan, resolve_backends)
from rl_engine.ops.registry import get_spec
from rl_engine.ops.spec import TRANSFORMS, Workload
from rl_engine.provenance import kernel_id

def _cell(key: CellKey, status: str, reason: str, details: dict[str, Any], duration: float, kid: str | None) -> dict[str, Any]:
    cell = {"op": key.op, "backend": key.backend, "judgment": key.judgment, "transform": key.transform,
            "status": status, "requested_backend": key.backend, "actual_backend": key.backend,
            "kernel_id": kid, "duration_s": round(duration, 4), "details": details}
    if status != J.GREEN or reason:
        cell["reason"] = reason or "(no reason given)"
    return cell


def root_cause(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The earliest op, in the model's op order, with a red cell."""
    order = {op: i for i, op in enumerate(OPS + ("chain",))}
    red = [c for c in cells if c["status"] == J.RED]
    if not red:
        return None
    first = min(red, key=lambda c: order.get(c["op"], len(order)))
    same = [c for c in red if c["op"] == first["op"]]
    return {"op": first["op"], "red_cells": len(same),
            "cells": [f"{c['backend']}/{c['judgment']}" + (f"/{c['transform']}" if c["transform"] else "") for c in same],
            "hint": f"{first['op']} is the earliest failing op in the model's op order; fix it first, later ops may inherit its error"}


class _FreshRuns:
    """One fresh Python process per backend computes the repeat outputs of its ops.

    :meth:`start` launches the processes in the background when the run begins, so their imports,
    case building and kernel runs overlap the other cells; :meth:`get` waits for a backend's
    process the first time one of its repeat cells needs it (launching it then if :meth:`start`
    did not). :meth:`close` stops any process still running and removes its files, finishing even
    through a second Ctrl-C. A process that cannot start, or whose results cannot be read, turns
    that backend's repeat cells red with the reason.

    The child runs from the folder that holds this ``rl_engine`` package (so ``python -m`` imports
    the same code as the gate, whatever the caller's working directory), gets the gate's pid and
    stops when the gate is gone; its folder ``.repeat-*`` in the output folder names its owner's
    pid, and :func:`sweep_stale_fresh_dirs` removes those of dead owners.
    """

    def __init__(self, ops: list[str], workload: Workload, seed: int, out_dir: Path):
        self.ops, self.workload, self.seed, self.out_dir = ops, workload, seed, out_dir
        self._done: dict[str, tuple[dict[str, torch.Tensor], dict[str, str], str | None]] = {}
        self._running: dict[str, tuple[Any, Path]] = {}

    def start(self, ops_per_backend: dict[str, list[str]]) -> None:
        for b, ops in ops_per_backend.items():
            if b not in self._done and b not in self._running:
                self._start_one(b, ops)

    def _start_one(self, backend: str, ops: list[str]) -> None:
        try:
            self._running[backend] = self._launch(backend, ops)
        except OSError as exc:
            self._done[backend] = ({}, {}, f"the fresh process could not start: {type(exc).__name__}: {exc}")

    def get(self, op: str, backend: str) -> tuple[dict[str, torch.Tensor], str | None]:
        if backend not in self._done and backend not in self._running:
            self._start_one(backend, self.ops)
        if backend not in self._done:
            proc, tmp = self._running[backend]
            code = proc.wait()  # a cell timeout may interrupt this: the process then stays listed
            del self._running[backend]
            try:
                self._done[backend] = self._read(code, tmp)
            except BaseException:  # e.g. a cell timeout while loading: later cells must not wait again
                self._done[backend] = ({}, {}, "reading its results was interrupted (cell timeout or signal)")
                raise
        tensors, errors, failure = self._done[backend]
        if failure:
            return {}, failure
        if not any(k.startswith(op + ".") for k in tensors) and op not in errors:
            return {}, f"{op} was not in the fresh process's op list"
        return {k: v for k, v in tensors.items() if k.startswith(op + ".")}, errors.get(op)

    def close(self) -> None:
        interrupted: BaseException | None = None
        for proc, tmp in list(self._running.values()):
            while True:
                try:
                    if proc.poll() is None:
                        proc.kill()
                    proc.wait()
                    shutil.rmtree(tmp, ignore_errors=True)
                    break
                except KeyboardInterrupt as exc:  # a second Ctrl-C: finish the cleanup, then stop
                    interrupted = exc
        self._running.clear()
        if interrupted is not None:
            raise interrupted

    def _launch(self, backend: str, ops: list[str]) -> tuple[Any, Path]:
        import os
        import subprocess
        import sys
        import tempfile

        self.out_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.out_dir.resolve(), prefix=".repeat-"))
        (tmp / "owner.pid").write_text(f"{os.getpid()}\n")
        cmd = [sys.executable, "-m", "rl_engine.gate.fresh", "--backend", backend, "--workload", self.workload.name,
               "--seed", str(self.seed), "--ops", *ops, "--out", str(tmp / "fresh.pt"), "--parent-pid", str(os.getpid())]
        package_root = Path(__file__).resolve().parents[2]  # the folder holding rl_engine/
        # inherits the environment; stderr goes to a file so a chatty child cannot block on a full pipe
        try:
            with open(tmp / "stderr.txt", "w") as err:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, cwd=package_root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return proc, tmp

    def _read(self, code: int, tmp: Path):
        try:
            target = tmp / "fresh.pt"
            if code != 0 or not target.exists():
                err = (tmp / "stderr.txt").read_text(errors="replace").strip()[-500:]
                return {}, {}, f"fresh process exited {code}: {err}"
            data = torch.load(target, map_location="cpu", weights_only=True)
            return data["tensors"], data["errors"], None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def sweep_stale_fresh_dirs(out_dir: Path) -> None:
    """Remove ``.repeat-*`` folders in ``out_dir`` whose owning gate process no longer runs (left by
    a killed gate). Folders of a live owner are left alone."""
    import os

    for d in sorted(out_dir.glob(".repeat-*")) if out_dir.is_dir() else []:
        try:
            owner = int((d / "owner.pid").read_text().strip())
        except (OSError, ValueError):
            owner = None
        alive = False
        if owner is not None:
            try:
                os.kill(owner, 0)
                alive = True
            except ProcessLookupError:
                alive = False
            except PermissionError:  # another user's live process
                alive = True
        if not alive:
            shutil.rmtree(d, ignore_errors=True)


class _OpState:
    """Cases and reference results of one op, built lazily and shared by every backend."""

    def __init__(self, op: str, workload: Workload, seed: int, device: torch.device, fresh: _FreshRuns | None = None,
                 record: bool = True):
        self._fresh_runs = fresh
        self.record = record
        """Whether the accuracy cells keep their outputs (only a run with cross_backend cells reads them)."""
        self.spec = get_spec(op)
        self.workload, self.seed, self.device = workload, seed, device
        self._fwd: list[J.CaseResults] | None = None
        self._grad: list[J.CaseResults] | None = None
        self._cases = None
        self._grad_cases = None
        self.recorded: dict[tuple[str, str], dict[str, Any]] = {}
        """Outputs of this op's accuracy cells, ``(backend, "fwd"|"bwd")`` then case id, for its
        cross_backend cell."""

    def cases(self):
        if self._cases is None:
            self._cases = self.spec.build_cases(self.workload, self.seed, self.device)
        return self._cases

    def grad_cases(self):
        if self._grad_cases is None:
            self._grad_cases = self.spec.build_grad_cases(self.workload, self.seed + 500, self.device)
        return self._grad_cases

    def forward(self):
        if self._fwd is None:
            self._fwd = [J.prepare_forward(self.spec, c) for c in self.cases()]
        return self._fwd

    def gradient(self):
        if self._grad is None:
            self._grad = [J.prepare_gradient(self.spec, c) for c in self.grad_cases()]
        return self._grad

    def fresh(self, backend: str) -> tuple[dict[str, torch.Tensor], str | None]:
        if self._fresh_runs is None:
            return {}, "no fresh-process runner configured"
        tensors, error = self._fresh_runs.get(self.spec.name, backend)
        return {k: v.to(self.device) for k, v in tensors.items()}, error

    def invariance_case(self, direction: str):
        if direction == "gradient" or self.spec.build_grad_cases is not None:
            if self.spec.build_grad_cases is not None:
                return self.grad_cases()[0]
        cases = self.cases()
        return cases[1] if len(cases) > 1 else cases[0]


NOT_PROVIDED = J.NOT_PROVIDED


def _plugin_impl(impl):
    """A plugin's NotImplementedError (parameters it does not support) becomes CaseNotProvided."""
    def call(**kw):
        try:
            return impl(**kw)
        except NotImplementedError as exc:
            raise J.CaseNotProvided(str(exc) or "not implemented by the backend") from exc

    call.__name__ = getattr(impl, "__name__", "plugin_impl")
    call.__wrapped__ = impl
    return call


def _cross_cell(state: _OpState, key: CellKey, contract: Contract,
                cross_pair: tuple[str, str]) -> tuple[str, str, dict[str, Any], str | None]:
    """The ``cross_backend`` cell of one op: ``cross_pair[1]`` (the cell's backend) against
    ``cross_pair[0]`` on every case, reusing the outputs this op's accuracy cells recorded."""
    anchor, other = cross_pair
    spec = state.spec
    impls, no_backward = {}, []
    for b in (anchor, other):
        plugin = external_backend(b)
        impl = spec.impls.get(b) if plugin is None else plugin.ops.get(key.op)
        if impl is None:
            return NOT_PROVIDED, f"backend {b} does not provide {key.op}", {}, None
        impls[b] = impl if plugin is None else _plugin_impl(impl)
        if plugin is not None and key.op not in plugin.backward:
            no_backward.append(b)
    why = contract.cross_backend.reason_not_declared(key.op)
    gradient = state.gradient() if spec.grad_inputs and not no_backward else []
    kid = f"{kernel_id(key.op, anchor, impls[anchor])}|{kernel_id(key.op, other, impls[other])}"
    status, reason, details = J.cross_backend(spec, impls, anchor, other, state.forward(), gradient, contract, why,
                                              state.recorded)
    if no_backward and spec.grad_inputs:
        details["gradients_not_compared"] = f"{', '.join(no_backward)} does not provide the backward of {key.op}"
    return status, reason, details, kid


def run_cell(state: _OpState, key: CellKey, contract: Contract,
             cross_pair: tuple[str, str] = ("triton_cuda_bf16", "cuda_bf16")) -> tuple[str, str, dict[str, Any], str | None]:
    if key.judgment == "cross_backend":
        return _cross_cell(state, key, contract, cross_pair)
    spec = state.spec
    plugin = external_backend(key.backend)
    if plugin is not None:
        impl = plugin.ops.get(key.op)
        if impl is None:
            return NOT_PROVIDED, f"backend {key.backend} does not provide {key.op}", {}, None
        if key.judgment in ("gradient_accuracy", "gradient_invariance") and key.op not in plugin.backward:
            return NOT_PROVIDED, f"backend {key.backend} does not provide the backward of {key.op}", {}, None
        if key.judgment.endswith("_invariance") and key.op not in plugin.batch_invariant:
            return J.NA, f"backend {key.backend} does not claim batch invariance for {key.op}", {}, None
        impl = _plugin_impl(impl)
        spec = _with_impl(spec, key.backend, impl)
    else:
        impl = spec.impls.get(key.backend)
    if impl is None:
        return J.RED, f"{key.op} has no {key.backend} implementation", {}, None
    kid = kernel_id(key.op, key.backend, impl)
    if key.judgment == "forward_accuracy":
        return (*J.forward_accuracy(spec, impl, state.forward(), contract, _record(state, key.backend, "fwd")), kid)
    if key.judgment == "repeat":
        if plugin is not None and plugin.origin == "python":
            fresh, error = None, None  # registered in this process only: a fresh process cannot rebuild it
        else:
            fresh, error = state.fresh(key.backend)
        prebuilt = (state.cases()[0], state.grad_cases()[0] if spec.build_grad_cases is not None else None)
        return (*J.repeat(spec, key.backend, fresh, error, state.workload, state.seed, state.device, contract, prebuilt),
                kid)
    if key.judgment == "gradient_accuracy":
        if not spec.grad_inputs:
            return J.NA, spec.no_grad_reason or "no input of this op takes a gradient", {}, kid
        return (*J.gradient_accuracy(spec, impl, state.gradient(), contract, _record(state, key.backend, "bwd")), kid)
    direction = "forward" if key.judgment == "forward_invariance" else "gradient"
    t = spec.transform(key.transform)
    if isinstance(t, str):
        return J.NA, t, {}, kid
    if direction == "gradient" and not spec.grad_inputs:
        return J.NA, spec.no_grad_reason or "no input of this op takes a gradient", {}, kid
    return (*J.invariance(spec, impl, key.transform, state.invariance_case(direction), direction, contract), kid)


def _record(state: _OpState, backend: str, direction: str) -> dict[str, Any] | None:
    """Where the accuracy cell keeps its outputs for the op's cross_backend cell: built-in backends
    only (their ops return fresh tensors; a plugin might reuse an output buffer that later cells
    overwrite, so its outputs are computed again in the cross cell)."""
    if not state.record or external_backend(backend) is not None:
        return None
    return state.recorded.setdefault((backend, direction), {})


def _with_impl(spec, backend: str, impl):
    """The op spec with a plugin's implementation added under its backend name (a shallow copy)."""
    import dataclasses

    return dataclasses.replace(spec, impls={**spec.impls, backend: impl})


def _chain_cells(config: GateConfig, contract: Contract, backend: str) -> tuple[str, str, dict[str, Any], str | None]:
    if external_backend(backend) is not None:
        return NOT_PROVIDED, f"backend {backend} is judged op by op; the Qwen3 chain runs on built-in backends only", {}, None
    try:
        from rl_engine.chain.gate import chain_parity_cell
    except ImportError:
        return J.RED, "chain_parity requested but the Qwen3 chain is not implemented yet", {}, None
    return chain_parity_cell(backend, config.workload, contract, config.seed)


class CellTimeout(BaseException):
    """A cell ran past ``--cell-timeout``. A BaseException, so that code catching ``Exception``
    (the Triton interpreter wraps those) cannot turn it into an ordinary error."""


@contextlib.contextmanager
def _time_limit(seconds: float | None):
    """Raise CellTimeout in the main thread after ``seconds`` (SIGALRM; a no-op off the main thread).

    A Python-level limit: a GPU kernel that never returns cannot be interrupted this way; kill the
    process and finish with ``--resume``.
    """
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def handler(signum, frame):
        raise CellTimeout()

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def cross_backend(config: GateConfig, device: torch.device, contract: Contract) -> list[dict[str, Any]]:
    """Informational: the largest difference between each judged backend and the first one on the
    same inputs, and whether they are bitwise equal. Scope ``config.cross_backend``
    (:data:`rl_engine.gate.plan.CROSS_BACKEND_SCOPES`): with ``declared``, for the ops whose
    arithmetic the contract declares identical on both backends (``cross_backend.declared_bit_exact``,
    ``docs/declared-arithmetic.md``) every case, forward outputs and input gradients, for the
    others the first case's forward outputs; with ``all``, every case, forward and gradients, of
    every op. Not a judgment: for a run whose pair is the contract's, the ``cross_backend`` cells
    are (:func:`_cross_cell`)."""
    from rl_engine.gate.compare import compare_bitwise
    from rl_engine.ops.execute import make_upstream, run_forward, run_gradient

    def row(op, case, path, x, y, pair):
        diff = float((x.float() - y.float()).abs().max()) if x.numel() else 0.0
        return {"op": op, "case": case.id, "output": path, "backends": pair, "max_abs_difference": diff,
                "bitwise_equal": compare_bitwise(f"{op}.{path}", x, y, "bitwise_equal").passed}

    rows = []
    first = config.backends[0]
    for op in config.ops:
        spec = get_spec(op)
        try:
            impls = {}
            for b in config.backends:
                plugin = external_backend(b)
                impl = spec.impls.get(b) if plugin is None else plugin.ops.get(op)
                if impl is not None:
                    impls[b] = impl
            if first not in impls or len(impls) < 2:
                continue
            declared = op in contract.cross_backend.declared or config.cross_backend == "all"
            cases = spec.build_cases(config.workload, config.seed, device)
            for case in cases if declared else cases[:1]:
                base = run_forward(impls[first], case.inputs)
                upstream = make_upstream(base, case.seed + 1000) if spec.grad_inputs and declared else None
                base_grads = (run_gradient(impls[first], case.inputs, spec.grad_inputs, upstream=upstream)[1]
                              if upstream is not None else {})
                for b, impl in impls.items():
                    if b == first:
                        continue
                    for i, (x, y) in enumerate(zip(base, run_forward(impl, case.inputs))):
                        rows.append(row(op, case, f"fwd.{spec.outputs[i] if i < len(spec.outputs) else i}", x, y, [first, b]))
                    if upstream is not None:
                        grads = run_gradient(impl, case.inputs, spec.grad_inputs, upstream=upstream)[1]
                        for name in spec.grad_inputs:
                            rows.append(row(op, case, f"bwd.d{name}", base_grads[name], grads[name], [first, b]))
        except Exception as exc:  # informational: a failure here is recorded, never fatal
            rows.append({"op": op, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _chain_cross_cell(config: GateConfig, contract: Contract) -> tuple[str, str, dict[str, Any], str | None]:
    anchor, other = config.cross_pair
    for b in (anchor, other):
        if external_backend(b) is not None:
            return NOT_PROVIDED, f"backend {b} is judged op by op; the Qwen3 chain runs on built-in backends only", {}, None
    from rl_engine.chain.gate import chain_cross_backend_cell

    return chain_cross_backend_cell(anchor, other, config.workload, contract, config.seed)


def _builds(config: GateConfig, device: torch.device) -> dict[str, Any]:
    """Build (or find in the cache) each compiled backend before the first cell, so that no cell's
    duration holds a compile, and record how: ``cached`` false means a cold build in this run, and
    ``build_seconds`` is the wall time of the build that produced the library."""
    builds: dict[str, Any] = {}
    if "cuda_bf16" in config.backends and device.type == "cuda":
        try:
            from rl_engine.backends.cuda_build import load_library

            builds["cuda_bf16"] = load_library().build.as_dict()
        except Exception as exc:  # the cells that need it turn red with their own error
            builds["cuda_bf16"] = {"error": f"{type(exc).__name__}: {exc}"}
    return builds


def resume_identity(evidence: dict[str, Any]) -> dict[str, Any]:
    """What must not change between a run and its resumption."""
    prov = evidence["provenance"]
    # modified tracked files, not untracked ones: the run's own output folder may sit in the checkout
    dirty = prov.get("git_dirty_tracked") if "git_dirty_tracked" in prov else prov.get("git_dirty")
    return {"git_commit": prov.get("git_commit"), "modified_tracked_files": dirty,
            "contract_sha256": evidence["contract"]["sha256"], "workload": evidence["workload"]["name"],
            "ops": list(evidence["ops"]), "judgments": list(evidence["judgments"]),
            "backends": list(evidence["backends"]["judged"]), "seed": evidence.get("seed")}


def run_gate(config: GateConfig, contract: Contract, on_cell: Callable[[dict[str, Any], int, int], None] | None = None,
             device: torch.device | None = None) -> dict[str, Any]:
    """Run the matrix; keep `evidence.json` current as cells finish (see EVIDENCE_WRITE_INTERVAL_S); return the final evidence."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    cb = contract.cross_backend
    config.cross_pair = (cb.anchor, cb.other)  # the contract's pair, whatever the caller built
    keys = plan(config)
    evidence: dict[str, Any] = {
        "schema_version": evidence_io.SCHEMA_VERSION,
        "kind": "gate",
        "contract_version": contract.version,
        "contract": contract.identity(),
        "provenance": provenance.collect(contract),
        "workload": config.workload.as_dict(),
        "seed": config.seed,
        "cell_timeout_s": config.cell_timeout,
        "complete": False,
        "backends": {"requested": config.requested_backends or config.backends, "judged": config.backends,
                     "left_out": config.left_out},
        "ops": config.ops,
        "judgments": config.judgments,
        "transforms": list(TRANSFORMS),
        "nan_policy": contract.nan_policy,
        "cells": [],
        "summary": {"green": 0, "red": 0, "n/a": 0, NOT_PROVIDED: 0},
        "root_cause": None,
        "wall_time_s": 0.0,
    }
    with _OutputLock(config.out_dir):
        sweep_stale_fresh_dirs(config.out_dir)
        if config.resume is None:  # at once: a folder never shows a finished older run while this one works
            evidence_io.write_atomic(config.out_dir / "evidence.json", evidence)
        return _run_gate_locked(config, contract, on_cell, device, t0, keys, evidence)


class _OutputLock:
    """An exclusive, non-blocking lock on ``DIR/.gate.lock`` for one run: a second gate writing
    into the same folder stops with an error instead of overwriting the first one's evidence.
    (No-op where ``fcntl`` is missing.)"""

    def __init__(self, out_dir: Path):
        self.path = out_dir / ".gate.lock"
        self.handle = None

    def __enter__(self) -> _OutputLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a+")
        try:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.handle.seek(0)
            owner = self.handle.read().strip() or "?"
            self.handle.close()
            self.handle = None
            raise RLEngineError(f"another rl-engine gate (pid {owner}) is writing into {self.path.parent}; "
                                "wait for it or choose another --out") from None
        import os

        self.handle.seek(0)
        self.handle.truncate()
        self.handle.write(f"{os.getpid()}\n")
        self.handle.flush()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            self.path.unlink(missing_ok=True)
            self.handle.close()  # closing releases the lock
            self.handle = None


def _run_gate_locked(config: GateConfig, contract: Contract, on_cell, device: torch.device, t0: float,
                     keys: list[CellKey], evidence: dict[str, Any]) -> dict[str, Any]:
    try:
        from rl_engine.audit import run_audit

        rows = run_audit(contract=contract)
        evidence["audit"] = {"conformant": all(r.status == "conformant" for r in rows), "rows": [r.as_dict() for r in rows]}
    except Exception as exc:  # the audit must not cost the run; its failure is recorded
        evidence["audit"] = {"conformant": False, "rows": [], "error": f"{type(exc).__name__}: {exc}"}
    evidence["backends"]["builds"] = _builds(config, device)
    fresh = _FreshRuns(config.ops, config.workload, config.seed, config.out_dir)
    done: dict[tuple[Any, ...], dict[str, Any]] = {}
    if config.resume is not None:
        for c in config.resume["cells"]:
            done[(c["op"], c["backend"], c["judgment"], c.get("transform"))] = c
        evidence["resumed_from"] = {"cells_kept": len(done), "wall_time_s": config.resume.get("wall_time_s")}
    # the fresh processes of the repeat cells still to run start now and overlap the other cells
    todo: dict[str, list[str]] = {}
    for k in keys:
        if k.judgment == "repeat" and _fresh_process_can_rebuild(k.backend) and \
                (k.op, k.backend, k.judgment, k.transform) not in done:
            todo.setdefault(k.backend, []).append(k.op)
    path = config.out_dir / "evidence.json"
    try:
        fresh.start(todo)
        _cell_loop(config, contract, keys, evidence, done, fresh, device, t0, on_cell, path)
    finally:  # an interrupted run keeps every cell it finished (the loop writes at most once a second)
        try:
            fresh.close()
        finally:
            evidence_io.write_atomic(path, evidence)
    if len(config.backends) >= 2 and config.cross_backend != "none" and not config.cross_judged():
        evidence["cross_backend_scope"] = config.cross_backend
        evidence["cross_backend"] = cross_backend(config, device, contract)
    evidence["complete"] = True
    evidence["wall_time_s"] = round(time.perf_counter() - t0, 3)
    evidence_io.write_atomic(path, evidence)
    return evidence


def _fresh_process_can_rebuild(backend: str) -> bool:
    """False for a plugin registered from Python in this process only (a new process cannot load it)."""
    plugin = external_backend(backend)
    return plugin is None or plugin.origin != "python"


EVIDENCE_WRITE_INTERVAL_S = 1.0
"""evidence.json is rewritten after a cell when this long has passed since the last write, and
always when the run ends or is interrupted (a killed process loses at most this much work to
``--resume``). Validating and writing the ~1 MB Qwen3-8B evidence after each of its 340 cells
took about 17 s."""


def _cell_loop(config: GateConfig, contract: Contract, keys: list[CellKey], evidence: dict[str, Any],
               done: dict[tuple[Any, ...], dict[str, Any]], fresh: _FreshRuns, device: torch.device, t0: float,
               on_cell: Callable[[dict[str, Any], int, int], None] | None, path: Path) -> None:
    states: dict[str, _OpState] = {}  # one op's cases and results at a time
    last_write = time.perf_counter()
    for i, key in enumerate(keys):
        previous = done.get((key.op, key.backend, key.judgment, key.transform))
        if previous is not None:
            evidence["cells"].append(previous)
            evidence["summary"][previous["status"]] = evidence["summary"].get(previous["status"], 0) + 1
            if on_cell is not None:
                on_cell(previous, i + 1, len(keys))
            continue
        start = time.perf_counter()
        kid = None
        try:
            with _time_limit(config.cell_timeout):
                if key.judgment == "chain_parity":
                    status, reason, details, kid = _chain_cells(config, contract, key.backend)
                elif key.op == "chain":
                    status, reason, details, kid = _chain_cross_cell(config, contract)
                else:
                    if key.op not in states:
                        states.clear()  # one op's tensors at a time
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                        states[key.op] = _OpState(key.op, config.workload, config.seed, device, fresh,
                                                  record=config.cross_judged())
                    status, reason, details, kid = run_cell(states[key.op], key, contract, config.cross_pair)
        except CellTimeout:
            status, reason, details = J.RED, f"timeout: the cell ran longer than {config.cell_timeout:g} s", {}
            states.clear()
        except Exception as exc:  # per-cell isolation: the run goes on
            status, reason = J.RED, f"{type(exc).__name__}: {exc}"
            details = {"traceback": traceback.format_exc(limit=8)}
            if device.type == "cuda":
                torch.cuda.empty_cache()
        cell = _cell(key, status, reason, details, time.perf_counter() - start, kid)
        evidence["cells"].append(cell)
        evidence["summary"][status] = evidence["summary"].get(status, 0) + 1
        evidence["wall_time_s"] = round(time.perf_counter() - t0, 3)
        evidence["root_cause"] = root_cause(evidence["cells"])
        if time.perf_counter() - last_write >= EVIDENCE_WRITE_INTERVAL_S:
            evidence_io.write_atomic(path, evidence)
            last_write = time.perf_counter()
        if on_cell is not None:
            on_cell(cell, i + 1, len(keys))
