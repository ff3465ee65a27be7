"""``python -m rl_engine.tp.run``: real tensor-parallel invariance across ranks, written to ``tp.json``.

Usage::

    python -m rl_engine.tp.run --world-size 2 --backend nccl --out DIR   # two GPUs
    python -m rl_engine.tp.run --world-size 2 --backend gloo --out DIR   # CPU (Triton interpreter)
    torchrun --nproc-per-node 2 -m rl_engine.tp.run --backend nccl --out DIR

Ranks are spawned with ``torch.multiprocessing`` (or joined from torchrun's environment). Every
rank runs with :data:`rl_engine.tp.launch.NCCL_ENV` set (``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1``), recorded per rank.

Cells (shaped like the gate's: ``op``, ``backend``, ``judgment``, ``transform: "tp"``, ``status``,
``reason``, ``details``), for each kernel backend:

* ``det_gemm / forward_invariance / tp``, one per merge path (``all_reduce_bf16`` on NCCL at
  WS = 2, and ``gather_tree_bf16`` always): at the workload's det_gemm cases (the Qwen3
  projection shapes; ``smoke`` on the CPU, ``qwen3-8b`` on GPUs) the real row-parallel product on
  WS ranks must be bitwise equal (:func:`rl_engine.gate.compare.compare_bitwise`) to the TP=1
  product and to the simulated split :func:`rl_engine.ops.det_gemm.tp_split_det_gemm`, and
  identical on every rank.
* ``det_gemm / forward_invariance_control / tp``: the known-breaking FP32-merge variant
  (``gather_fp32_control``) must differ from TP=1 in every case (proves the check can fail).
* ``chain / chain_parity / tp``: the Qwen3 chain with q/k/v/o/gate/up/down row-parallel across the
  ranks, teacher forcing (lhs), against the single-process rollout decode (rhs) of the same
  weights and fixture, under :func:`rl_engine.gate.compare.chain_metrics` with the ``strict``
  profile (every FP32 logprob bitwise equal) and the ``ws1`` metrics. On a mismatch the first
  differing (token, layer, op) between the TP teacher forcing and the single-process rollout is
  named.
* ``chain / chain_parity_control / tp`` (``--chain-control``): the same with the FP32-merge
  control, which the strict check must reject.

Exit code: 0 when every cell is green, 1 when any is red, 2 when the run cannot start or a rank
dies (bad arguments, no GPUs for nccl, a crash outside a cell).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_engine.jsonio import strict_json, write_json_atomic
from rl_engine.errors import RLEngineError
from rl_engine.tp.launch import (NCCL_ENV, RankContext, apply_nccl_env, check_launch, finish_rank, init_from_env,
                                 launch, launched_by_torchrun)
from rl_engine.tp.row_parallel import MERGE_ALL_REDUCE, MERGE_DESCRIPTIONS, MERGE_FP32_CONTROL, MERGE_GATHER

SCHEMA = "rl_engine.tp/1"
GREEN, RED = "green", "red"
CHAIN_HEAD = "linear_logp"


@dataclass
class TPRunConfig:
    """What one run checks (every rank gets the same)."""

    world_size: int
    dist_backend: str
    out: str
    kernel_backends: list[str]
    workload: str
    seed: int = 0
    merges: list[str] = field(default_factory=list)
    chain: bool = True
    chain_model: str | None = None
    chain_fixture: str | None = None
    logit_scale: float | None = None
    chain_control: bool = False
    timeout_s: float = 1800.0


# -- helpers ---------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's shape, dtype and raw bytes (compares values across ranks)."""
    c = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{list(c.shape)}:{c.dtype}:".encode())
    h.update(c.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _gather(ctx: RankContext, obj: Any) -> list[Any]:
    import torch.distributed as dist

    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj, group=ctx.group)
    return out


def _jsonable(obj: Any) -> Any:
    """Strict JSON: inf / NaN as strings, tuples as lists, tensors refused."""
    return strict_json(obj)


def write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` as JSON through a temporary file in the same folder and ``os.replace``."""
    write_json_atomic(path, doc, prefix=".tp-")


def _cell(op: str, backend: str, judgment: str, status: str, reason: str, details: dict[str, Any],
          kernel_id: str | None, seconds: float) -> dict[str, Any]:
    return {"op": op, "backend": backend, "judgment": judgment, "transform": "tp", "status": status,
            "reason": reason, "requested_backend": backend, "actual_backend": backend, "kernel_id": kernel_id,
            "duration_s": round(seconds, 4), "details": details}


def default_merges(world_size: int, dist_backend: str) -> list[str]:
    """The merge paths a run checks: the BF16 all-reduce on NCCL at WS = 2, and the gather path always."""
    return [MERGE_ALL_REDUCE, MERGE_GATHER] if (dist_backend == "nccl" and world_size == 2) else [MERGE_GATHER]


# -- det_gemm ---------------------------------------------------------------------------------
def _det_gemm_cases(cfg: TPRunConfig, device: torch.device) -> list[Any]:
    from rl_engine.ops.det_gemm.spec import SPEC
    from rl_engine.ops.spec import get_workload

    return SPEC.build_cases(get_workload(cfg.workload), cfg.seed, device)


def det_gemm_cell(ctx: RankContext, cfg: TPRunConfig, kernel_backend: str, merge: str,
                  cases: list[Any], contract: Any) -> dict[str, Any]:
    """One det_gemm cell (collective). ``merge == gather_fp32_control`` makes it the negative control."""
    from rl_engine.backends.registry import resolve_impl
    from rl_engine.gate.compare import compare_bitwise
    from rl_engine.provenance import kernel_id
    from rl_engine.ops.det_gemm import tp_split_det_gemm
    from rl_engine.tp.row_parallel import rank_tree_depth, row_parallel_full, shard_bounds

    control = merge == MERGE_FP32_CONTROL
    t0 = time.perf_counter()
    impl = resolve_impl("det_gemm", kernel_backend)
    kid = kernel_id("det_gemm", kernel_backend, impl)
    nan_policy = contract.nan_policy
    rows = []
    with torch.no_grad():
        for case in cases:
            a, b = case.inputs["a"], case.inputs["b"]
            tp1 = impl(a=a, b=b)
            sim = tp_split_det_gemm(a, b, ctx.world_size, impl)
            real = row_parallel_full(a, b, ctx.group, merge=merge, backend=impl)
            _sync(ctx.device)
            vs_tp1 = compare_bitwise(f"{case.id}: TP={ctx.world_size} vs TP=1", tp1, real, nan_policy)
            vs_sim = compare_bitwise(f"{case.id}: TP={ctx.world_size} vs simulated split", sim, real, nan_policy)
            rows.append({"case": case.id, "seed": case.seed, "shape": {"M": a.shape[0], "K": a.shape[1], "N": b.shape[1]},
                         "shard_bounds": shard_bounds(int(a.shape[1]), ctx.world_size),
                         "inputs_digest": _digest(a) + ":" + _digest(b), "result_digest": _digest(real),
                         "vs_tp1": vs_tp1.as_dict(), "vs_simulated": vs_sim.as_dict(),
                         "simulated_vs_tp1_bitwise": bool(torch.equal(sim.view(torch.int16), tp1.view(torch.int16)))})
    seen = _gather(ctx, [(r["inputs_digest"], r["result_digest"]) for r in rows])
    details: dict[str, Any] = {
        "world_size": ctx.world_size, "dist_backend": ctx.dist_backend, "merge_path": merge,
        "merge": MERGE_DESCRIPTIONS[merge], "rank_tree_depth": rank_tree_depth(ctx.world_size),
        "contract_tree_depth": int(contract.det_gemm["tree_depth"]), "workload": cfg.workload,
        "nan_policy": nan_policy, "cases": rows,
    }
    same_inputs = all(s[i][0] == seen[0][i][0] for s in seen for i in range(len(rows)))
    same_result = all(s[i][1] == seen[0][i][1] for s in seen for i in range(len(rows)))
    details["inputs_identical_across_ranks"] = same_inputs
    details["result_identical_across_ranks"] = same_result
    n = len(rows)
    eq_tp1 = sum(r["vs_tp1"]["passed"] for r in rows)
    eq_sim = sum(r["vs_simulated"]["passed"] for r in rows)
    if control:
        caught = n - eq_tp1
        ok = n > 0 and caught == n and same_inputs
        judgment = "forward_invariance_control"
        reason = (f"negative control caught: the FP32-merge variant differs from TP=1 in {caught}/{n} cases"
                  if ok else f"negative control NOT caught: the FP32-merge variant equals TP=1 bitwise in "
                             f"{eq_tp1}/{n} cases (the check could not fail there)"
                  + ("" if same_inputs else "; ranks drew different inputs"))
    else:
        ok = n > 0 and eq_tp1 == n and eq_sim == n and same_inputs and same_result
        judgment = "forward_invariance"
        if ok:
            reason = (f"TP={ctx.world_size} ({merge}) bitwise equal to TP=1 and to the simulated split in all "
                      f"{n} cases, identical on every rank")
        else:
            bad = [r["vs_tp1"]["path"] + " / " + r["vs_simulated"]["path"] for r in rows
                   if not (r["vs_tp1"]["passed"] and r["vs_simulated"]["passed"])]
            reason = (f"TP={ctx.world_size} ({merge}): equal to TP=1 in {eq_tp1}/{n}, to the simulated split in "
                      f"{eq_sim}/{n} cases; ranks agree: {same_result}; inputs agree: {same_inputs}"
                      + (f"; first failing: {bad[0]}" if bad else ""))
    details["equal_to_tp1"] = eq_tp1
    details["equal_to_simulated"] = eq_sim
    return _cell("det_gemm", kernel_backend, judgment, GREEN if ok else RED, reason, details, kid,
                 time.perf_counter() - t0)


# -- chain ------------------------------------------------------------------------------------
def _chain_plan(cfg: TPRunConfig) -> dict[str, Any]:
    from rl_engine.chain.gate import PLANS

    plan = PLANS.get(cfg.workload)
    if plan is None:
        raise RLEngineError(f"no chain plan for workload {cfg.workload!r}; known: {', '.join(PLANS)}")
    offset, scale = plan["runs"][0]
    return {"model": cfg.chain_model or plan["model"], "fixture": cfg.chain_fixture or plan["fixture"],
            "seed": cfg.seed + int(offset), "logit_scale": float(cfg.logit_scale if cfg.logit_scale is not None else scale)}


class ChainRun:
    """The shared inputs of the chain cells on one rank (weights, fixture, single-process results)."""

    def __init__(self, ctx: RankContext, cfg: TPRunConfig, kernel_backend: str):
        from rl_engine.chain.config import get_config
        from rl_engine.chain.fixtures import make_fixture
        from rl_engine.chain.model import Qwen3Model
        from rl_engine.chain.scoring import score_rollout, score_teacher_forcing
        from rl_engine.chain.weights import synthetic_weights

        self.ctx, self.backend = ctx, kernel_backend
        self.plan = _chain_plan(cfg)
        self.config = get_config(self.plan["model"])
        self.weights = synthetic_weights(self.config, self.plan["seed"], logit_scale=self.plan["logit_scale"],
                                         device=ctx.device)
        self.fixture = make_fixture(self.plan["fixture"], self.plan["seed"], self.config.vocab_size)
        self.batch = self.fixture.batch()
        self.plain = Qwen3Model(self.weights, kernel_backend)
        # the single-process references are split over the ranks: rank 0 teacher forcing, rank 1 rollout
        self.train_rank, self.rollout_rank = 0, 1 % ctx.world_size
        mine: dict[str, Any] = {"rank": ctx.rank, "weights_hash": self.weights.content_hash(), "seconds": {}}
        with torch.no_grad():
            if ctx.rank == self.train_rank:
                t0 = time.perf_counter()
                mine["single_train"] = score_teacher_forcing(self.plain, self.batch, head=CHAIN_HEAD).float().cpu()
                _sync(ctx.device)
                mine["seconds"]["single_train_s"] = round(time.perf_counter() - t0, 4)
            if ctx.rank == self.rollout_rank:
                t0 = time.perf_counter()
                mine["single_rollout"] = score_rollout(self.plain, self.batch, head=CHAIN_HEAD).float().cpu()
                _sync(ctx.device)
                mine["seconds"]["single_rollout_s"] = round(time.perf_counter() - t0, 4)
        got = _gather(ctx, mine)
        self.weights_hashes = [g["weights_hash"] for g in got]
        self.single_train = got[self.train_rank]["single_train"]
        self.single_rollout = got[self.rollout_rank]["single_rollout"]
        self.single_seconds = {**got[self.train_rank]["seconds"], **got[self.rollout_rank]["seconds"]}

    def describe(self) -> dict[str, Any]:
        return {"preset": self.plan["model"], "config": self.config.to_dict(),
                "weights": {k: v for k, v in self.weights.provenance.items() if k != "recipe"},
                "weights_hash_per_rank": self.weights_hashes, "device": str(self.ctx.device)}


def chain_cell(ctx: RankContext, cfg: TPRunConfig, run: ChainRun, merge: str, contract: Any) -> dict[str, Any]:
    """TP teacher forcing vs the single-process rollout decode (collective)."""
    from rl_engine.chain.gate import chain_kernel_id
    from rl_engine.chain.scoring import SAMPLING, TokenKeys, score_rollout, score_teacher_forcing
    from rl_engine.chain.parity import ActivationRecorder, first_divergence_from, flat_metrics
    from rl_engine.gate.compare import chain_metrics, compare_bitwise
    from rl_engine.tp.chain import PROJECTIONS, RowParallelQwen3Model, expected_linear_calls

    control = merge == MERGE_FP32_CONTROL
    t0 = time.perf_counter()
    model = RowParallelQwen3Model(run.weights, run.backend, ctx.group, merge=merge)
    with torch.no_grad():
        tp_train = score_teacher_forcing(model, run.batch, head=CHAIN_HEAD).float().cpu()
    _sync(ctx.device)
    tp_s = round(time.perf_counter() - t0, 4)
    got = _gather(ctx, {"digest": _digest(tp_train), "linear_calls": model.linear_calls})
    ranks_agree = all(g["digest"] == got[0]["digest"] for g in got)
    calls_ok = all(g["linear_calls"] == expected_linear_calls(model, 1) for g in got)
    weights_same = all(h == run.weights_hashes[0] for h in run.weights_hashes)
    strict = chain_metrics(tp_train, run.single_rollout, contract.chain_thresholds("strict"))
    ws1 = chain_metrics(tp_train, run.single_rollout, contract.chain_thresholds("ws1"))
    nan_policy = contract.nan_policy
    vs_single_train = compare_bitwise("tp teacher forcing vs single-process teacher forcing",
                                      run.single_train, tp_train, nan_policy, check_device=False)
    single_parity = compare_bitwise("single-process teacher forcing vs single-process rollout",
                                    run.single_rollout, run.single_train, nan_policy, check_device=False)
    first_div = None
    if not strict.passed and ranks_agree and not control:
        # every rank re-runs the TP teacher forcing with a recorder (collective); the rollout side
        # re-runs on the single-process model of this rank; only rank 0's answer is kept
        keys = TokenKeys(run.batch)
        rt = ActivationRecorder(keys.total)
        with torch.no_grad():
            score_teacher_forcing(model, run.batch, head=CHAIN_HEAD, recorder=rt)
            if ctx.rank == 0:
                rr = ActivationRecorder(keys.total)
                score_rollout(run.plain, run.batch, head=CHAIN_HEAD, recorder=rr)
                first_div = first_divergence_from(rt, rr, run.batch)
    flat = flat_metrics(ws1)
    details: dict[str, Any] = {
        "world_size": ctx.world_size, "dist_backend": ctx.dist_backend, "merge_path": model.merge_path,
        "merge": MERGE_DESCRIPTIONS[model.merge_path], "split_layers": list(PROJECTIONS),
        "layout": "every rank holds the full activations and weights; each projection takes the rank's contiguous "
                  "K slice of x and of W.t() (mid-split) and merges the partials across ranks",
        "lhs": f"teacher forcing, projections row-parallel over {ctx.world_size} ranks",
        "rhs": f"rollout (prefill + KV-cache decode) in one process (rank {run.rollout_rank}), no split",
        "profile": "strict", "profiles_checked": ["strict", "ws1"],
        "active_tokens": int(tp_train.numel()),
        **{k: flat[k] for k in ("max_abs_dlogp", "mean_abs_dlogp", "approx_kl0", "clipfrac0", "p99_abs_dlogp",
                                "p999_abs_dlogp", "bitwise_equal_tokens")},
        "metrics": {**ws1.metrics, "strict_dlogp_zero": strict.metrics["strict_dlogp_zero"]},
        "strict": {"passed": strict.passed, "summary": strict.summary(),
                   "first_nonzero_token": strict.first_nonzero_token},
        "ws1": {"passed": ws1.passed, "summary": ws1.summary()},
        "tp_vs_single_teacher_forcing": vs_single_train.as_dict(),
        "single_process_train_vs_rollout": single_parity.as_dict(),
        "ranks_agree": ranks_agree, "weights_identical_across_ranks": weights_same,
        "linear_calls_per_rank": [g["linear_calls"] for g in got],
        "linear_calls_expected": expected_linear_calls(model, 1),
        "first_divergence": first_div,
        "fixture": run.fixture.describe(), "model": run.describe(), "head": CHAIN_HEAD, "sampling": dict(SAMPLING),
        "roles": dict(ws1.roles),
        "seconds": {"tp_train_s": tp_s, **run.single_seconds},
    }
    kid = chain_kernel_id(run.backend, model.ops.kernel_ids())
    if control:
        ok = not strict.passed and weights_same
        reason = (f"negative control caught: with FP32 merges {strict.active_tokens - strict.bitwise_equal_tokens}/"
                  f"{strict.active_tokens} logprobs differ from the single-process rollout" if ok else
                  "negative control NOT caught: the FP32-merge chain still matches the rollout bitwise")
        return _cell("chain", run.backend, "chain_parity_control", GREEN if ok else RED, reason, details, kid,
                     time.perf_counter() - t0)
    problems = []
    if not strict.passed:
        where = ""
        if first_div:
            where = (f"; first divergence at {first_div['where']}, sequence {first_div['token']['seq']} position "
                     f"{first_div['token']['pos']}")
        problems.append(f"strict profile failed: {strict.active_tokens - strict.bitwise_equal_tokens}/"
                        f"{strict.active_tokens} active tokens differ (TP teacher forcing vs single-process rollout){where}")
    if not ws1.passed:
        problems.append("ws1 gate metrics failed: " + ", ".join(
            f"{k} {m['value']:.3e} > {m['threshold']:g}" for k, m in ws1.metrics.items()
            if m["decision"] == "gate" and not m["passed"]))
    if not ranks_agree:
        problems.append("the ranks' teacher-forcing logprobs differ from each other")
    if not weights_same:
        problems.append("the ranks generated different weights")
    if not calls_ok:
        problems.append(f"row-parallel calls per rank {details['linear_calls_per_rank']} != expected "
                        f"{details['linear_calls_expected']} (the model did not route every projection through the hook)")
    reason = "; ".join(problems) if problems else (
        f"strict: all {strict.active_tokens} active tokens of TP={ctx.world_size} teacher forcing bitwise equal to "
        f"the single-process rollout decode; ws1 metrics hold; ranks agree")
    return _cell("chain", run.backend, "chain_parity", GREEN if not problems else RED, reason, details, kid,
                 time.perf_counter() - t0)


# -- one rank ---------------------------------------------------------------------------------
def _guarded(ctx: RankContext, cells: list[dict[str, Any]], op: str, backend: str, judgment: str, fn: Any) -> Any:
    """Run ``fn()``; an error becomes a red cell (same on every rank for errors every rank raises)."""
    t0 = time.perf_counter()
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a failing cell is reported, the run goes on
        cells.append(_cell(op, backend, judgment, RED, f"{type(exc).__name__}: {exc}",
                           {"world_size": ctx.world_size, "dist_backend": ctx.dist_backend, "rank": ctx.rank}, None,
                           time.perf_counter() - t0))
        return None


def rank_main(ctx: RankContext, cfg: TPRunConfig) -> dict[str, Any] | None:
    """Everything one rank does; rank 0 writes ``<out>/tp.json`` and returns the document."""
    from rl_engine import provenance
    from rl_engine.contract import load_contract

    start = time.perf_counter()
    contract = load_contract()
    cells: list[dict[str, Any]] = []
    merges = cfg.merges or default_merges(ctx.world_size, ctx.dist_backend)
    for kb in cfg.kernel_backends:
        cases = _guarded(ctx, cells, "det_gemm", kb, "forward_invariance",
                         lambda: _det_gemm_cases(cfg, ctx.device))
        if cases is not None:
            for merge in merges:
                cell = _guarded(ctx, cells, "det_gemm", kb, "forward_invariance",
                                lambda m=merge: det_gemm_cell(ctx, cfg, kb, m, cases, contract))
                if cell is not None:
                    cells.append(cell)
            cell = _guarded(ctx, cells, "det_gemm", kb, "forward_invariance_control",
                            lambda: det_gemm_cell(ctx, cfg, kb, MERGE_FP32_CONTROL, cases, contract))
            if cell is not None:
                cells.append(cell)
            del cases
        if cfg.chain:
            run = _guarded(ctx, cells, "chain", kb, "chain_parity", lambda: ChainRun(ctx, cfg, kb))
            if run is not None:
                cell = _guarded(ctx, cells, "chain", kb, "chain_parity",
                                lambda: chain_cell(ctx, cfg, run, "auto", contract))
                if cell is not None:
                    cells.append(cell)
                if cfg.chain_control:
                    cell = _guarded(ctx, cells, "chain", kb, "chain_parity_control",
                                    lambda: chain_cell(ctx, cfg, run, MERGE_FP32_CONTROL, contract))
                    if cell is not None:
                        cells.append(cell)
                del run
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
    ranks = _gather(ctx, ctx.describe())
    if ctx.rank != 0:
        return None
    nccl_version = None
    if ctx.dist_backend == "nccl":
        try:
            nccl_version = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001 - version readback only
            nccl_version = None
    prov = provenance.collect(contract)
    prov.update({"world_size": ctx.world_size, "dist_backend": ctx.dist_backend, "nccl_env": dict(NCCL_ENV)})
    prov["tp"] = {
        "world_size": ctx.world_size, "dist_backend": ctx.dist_backend, "launcher": ctx.launcher,
        "nccl_env": dict(NCCL_ENV), "nccl_env_seen_per_rank": [{k: r["env"].get(k) for k in NCCL_ENV} for r in ranks],
        "nccl_version": nccl_version, "ranks": ranks, "merge_paths": merges,
        "torch_distributed": {"gloo": torch.distributed.is_gloo_available(), "nccl": torch.distributed.is_nccl_available()},
    }
    counts = {GREEN: sum(c["status"] == GREEN for c in cells), RED: sum(c["status"] == RED for c in cells)}
    doc = {
        "schema": SCHEMA,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "verdict": GREEN if cells and counts[RED] == 0 else RED,
        "summary": counts,
        "config": asdict(cfg),
        "provenance": prov,
        "cells": cells,
        "wall_time_s": round(time.perf_counter() - start, 3),
    }
    write_atomic(Path(cfg.out) / "tp.json", doc)
    return json.loads(json.dumps(_jsonable(doc)))


# -- command line -------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m rl_engine.tp.run",
                                description="Real tensor-parallel invariance of det_gemm and the Qwen3 chain across ranks.")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks (a supported split of the contract: 1, 2, 4); default 2, or torchrun's WORLD_SIZE")
    p.add_argument("--backend", choices=("nccl", "gloo"), default=None,
                   help="torch.distributed backend (default: nccl when enough GPUs, else gloo)")
    p.add_argument("--out", required=True, help="folder for tp.json")
    p.add_argument("--kernel-backends", default="triton_cuda_bf16",
                   help="comma-separated det_gemm kernel backends (triton_cuda_bf16, cuda_bf16)")
    p.add_argument("--workload", choices=("smoke", "qwen3-8b"), default=None,
                   help="det_gemm shapes and chain plan (default: qwen3-8b on nccl, smoke on gloo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--merges", default=None,
                   help=f"comma-separated merge paths to check (default: {MERGE_ALL_REDUCE} and {MERGE_GATHER} on "
                        f"nccl at WS = 2, else {MERGE_GATHER})")
    p.add_argument("--no-chain", action="store_true", help="skip the chain cells")
    p.add_argument("--chain-model", default=None, help="chain preset (default: the gate plan's for the workload)")
    p.add_argument("--chain-fixture", default=None, help="chain fixture layout (default: the gate plan's)")
    p.add_argument("--logit-scale", type=float, default=None)
    p.add_argument("--chain-control", action="store_true",
                   help="also run the chain with the FP32-merge control (must fail the strict check)")
    p.add_argument("--timeout", type=float, default=1800.0, help="process-group timeout in seconds")
    return p


def _print_summary(doc: dict[str, Any]) -> None:
    for c in doc["cells"]:
        merge = c["details"].get("merge_path")
        tag = f" [{merge}]" if merge else ""
        print(f"{c['op']} {c['backend']} {c['judgment']}/tp{tag}: {c['status']} - {c['reason']}")
    print(f"tp verdict: {doc['verdict']} ({doc['summary'][GREEN]} green, {doc['summary'][RED]} red), "
          f"world size {doc['provenance']['tp']['world_size']}, {doc['provenance']['tp']['dist_backend']}")


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (see the module docstring)."""
    from rl_engine import env
    from rl_engine.errors import InputError

    args = _parser().parse_args(argv)
    if not torch.cuda.is_available() and not env.triton_interpret():
        env.enable_triton_interpreter()  # before any kernel module is imported (here and in spawned ranks)
    torchrun = launched_by_torchrun()
    ws = args.world_size or (env.torchrun_rank()[1] if torchrun else 2)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    dist_backend = args.backend or ("nccl" if gpus >= ws else "gloo")
    workload = args.workload or ("qwen3-8b" if dist_backend == "nccl" else "smoke")
    cfg = TPRunConfig(world_size=ws, dist_backend=dist_backend, out=str(Path(args.out).resolve()),
                      kernel_backends=[b.strip() for b in args.kernel_backends.split(",") if b.strip()],
                      workload=workload, seed=args.seed,
                      merges=[m.strip() for m in args.merges.split(",")] if args.merges else [],
                      chain=not args.no_chain, chain_model=args.chain_model, chain_fixture=args.chain_fixture,
                      logit_scale=args.logit_scale, chain_control=args.chain_control, timeout_s=args.timeout)
    bad_merge = [m for m in cfg.merges if m not in (MERGE_ALL_REDUCE, MERGE_GATHER)]
    if bad_merge:
        print(f"error: --merges takes {MERGE_ALL_REDUCE} or {MERGE_GATHER} (the control always runs), got {bad_merge}",
              file=sys.stderr)
        return 2
    try:
        check_launch(ws, dist_backend)
        if torchrun:
            apply_nccl_env()  # this process is a rank: set before anything creates a communicator
            started = env.torchrun_rank()[1]
            if started != ws:
                raise RLEngineError(f"--world-size {ws} but torchrun started {started} ranks")
            ctx = init_from_env(dist_backend, cfg.timeout_s)
            try:
                doc = rank_main(ctx, cfg)
            finally:
                finish_rank()
            if doc is None:
                return 0
        else:
            doc = launch(rank_main, ws, dist_backend, cfg, timeout_s=cfg.timeout_s)[0]
    except (RLEngineError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (torch.multiprocessing.ProcessRaisedException, torch.multiprocessing.ProcessExitedException) as exc:
        print(f"error: a rank failed, no tp.json was written:\n{exc}", file=sys.stderr)
        return 2
    _print_summary(doc)
    print(f"wrote {Path(cfg.out) / 'tp.json'}")
    return 0 if doc["verdict"] == GREEN else 1


if __name__ == "__main__":
    # run the importable module's main, so spawned ranks unpickle rl_engine.tp.run.* (not __main__.*)
    from rl_engine.tp.run import main as _main

    sys.exit(_main())
