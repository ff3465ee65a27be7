"""Real tensor parallelism on the CPU: gloo ranks in separate processes, Triton in its interpreter.

* topology helpers and merge-path selection (in process, no group);
* ``python -m rl_engine.tp.run --world-size 2 --backend gloo``: det_gemm TP=2 bitwise equal to TP=1
  and to the simulated split at the smoke projection shapes, the FP32-merge negative control caught,
  the Qwen3 chain (tiny-smoke) with row-parallel projections: teacher forcing bitwise equal to the
  single-process rollout decode (strict profile), its FP32-merge control caught, and tp.json's
  provenance (world size, backend, the three NVLS-off variables as every rank saw them);
* bad inputs on one rank raise InputError on every rank (no rank left in a collective);
* world size 4: the gather path merges ((p0 + p1) + (p2 + p3)) and equals TP=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_engine.errors import InputError, RLEngineError
from rl_engine.ops.det_gemm import mid_split_bounds
from rl_engine.tp import (MERGE_ALL_REDUCE, MERGE_FP32_CONTROL, MERGE_GATHER, check_world_size, rank_tree_depth,
                          resolve_merge, row_parallel_det_gemm, shard_bounds, shard_k)
from rl_engine.tp.launch import NCCL_ENV, launch, probe_det_gemm, probe_validation

ROOT = Path(__file__).resolve().parents[1]

# These gloo checks run the ranks' Triton kernels in the CPU interpreter, which is what a machine
# without a GPU has. On a machine with a GPU the spawned ranks do not get a working interpreter
# (without TRITON_INTERPRET they refuse CPU tensors; with it, triton 3.6's interpreter raises
# "only 0-dimensional arrays can be converted to Python scalars"), so the checks would fail for
# reasons that say nothing about tensor parallelism. There the real run is tools/h200x2_tp.sh
# (TP=2 over NCCL on two GPUs); world size 4 and the every-rank input validation are checked only here.
cpu_gloo_only = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="CPU-only TP check (gloo ranks, Triton CPU interpreter); with a GPU the real TP run is "
           "tools/h200x2_tp.sh over NCCL")


# ---------------------------------------------------------------- topology (no process group)
def test_shard_bounds_are_the_top_of_the_contract_tree(contract):
    assert contract.det_gemm["supported_splits"] == [1, 2, 4]
    assert shard_bounds(97, 1) == [0, 97]
    assert shard_bounds(97, 2) == [0, 48, 97]
    assert shard_bounds(97, 4) == mid_split_bounds(0, 97, 2) == [0, 24, 48, 72, 97]
    assert [rank_tree_depth(ws) for ws in (1, 2, 4)] == [2, 1, 0]
    x, b = torch.zeros(3, 97), torch.zeros(97, 5)
    xr, br = shard_k(x, b, 1, 2)
    assert xr.shape == (3, 49) and br.shape == (49, 5) and xr.data_ptr() == x[:, 48:].data_ptr()


@pytest.mark.parametrize("ws", [0, 3, 8, True, 2.0])
def test_unsupported_world_size_raises(ws):
    with pytest.raises(InputError, match="supported splits"):
        check_world_size(ws)


def test_merge_selection():
    assert resolve_merge("auto", 2, "nccl") == MERGE_ALL_REDUCE
    assert resolve_merge("auto", 2, "gloo") == MERGE_GATHER
    assert resolve_merge("auto", 4, "nccl") == MERGE_GATHER
    assert resolve_merge(MERGE_GATHER, 2, "nccl") == MERGE_GATHER
    with pytest.raises(InputError, match="world size 2"):
        resolve_merge(MERGE_ALL_REDUCE, 4, "nccl")
    with pytest.raises(InputError, match="merge must be"):
        resolve_merge("fp64", 2, "gloo")


def test_needs_a_process_group():
    import torch.distributed as dist

    assert not dist.is_initialized()
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(RLEngineError, match="process group"):
        row_parallel_det_gemm(x, x.t().contiguous())


def test_cli_refuses_bad_launches(tmp_path):
    from rl_engine.tp.run import main

    assert main(["--world-size", "3", "--backend", "gloo", "--out", str(tmp_path)]) == 2
    if not torch.cuda.is_available():
        assert main(["--world-size", "2", "--backend", "nccl", "--out", str(tmp_path)]) == 2
    assert main(["--world-size", "2", "--backend", "gloo", "--merges", MERGE_FP32_CONTROL,
                 "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "tp.json").exists()


# ---------------------------------------------------------------- the real run (2 gloo ranks)
@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    """``python -m rl_engine.tp.run`` with 2 gloo ranks, started with NCCL_NVLS_ENABLE=1 in the
    environment (the runner must override it to 0 for every rank)."""
    out = tmp_path_factory.mktemp("tp")
    env = dict(os.environ, NCCL_NVLS_ENABLE="1", TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    cmd = [sys.executable, "-m", "rl_engine.tp.run", "--world-size", "2", "--backend", "gloo", "--out", str(out),
           "--chain-control"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    doc = json.loads((out / "tp.json").read_text()) if (out / "tp.json").is_file() else None
    return proc, doc, out


def _cells(doc, judgment, op):
    return [c for c in doc["cells"] if c["judgment"] == judgment and c["op"] == op]


@cpu_gloo_only
def test_run_exits_green_and_writes_tp_json(tp_run):
    proc, doc, out = tp_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert doc is not None and doc["schema"] == "rl_engine.tp/1"
    assert doc["verdict"] == "green" and doc["summary"] == {"green": 4, "red": 0}
    assert "tp verdict: green" in proc.stdout
    assert [p.name for p in out.iterdir()] == ["tp.json"]  # atomic write left no temporary file
    for c in doc["cells"]:
        assert c["transform"] == "tp" and c["backend"] == "triton_cuda_bf16" and c["reason"]
        assert {"op", "judgment", "status", "details", "kernel_id"} <= set(c)


def test_provenance_records_world_size_backend_and_nccl_env(tp_run):
    _, doc, _ = tp_run
    tp = doc["provenance"]["tp"]
    assert doc["provenance"]["world_size"] == 2 and doc["provenance"]["dist_backend"] == "gloo"
    assert doc["provenance"]["nccl_env"] == NCCL_ENV
    assert tp["world_size"] == 2 and tp["dist_backend"] == "gloo" and tp["launcher"] == "spawn"
    assert tp["nccl_env"] == NCCL_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                          "NVSHMEM_DISABLE_NVLS": "1"}
    assert tp["nccl_env_seen_per_rank"] == [NCCL_ENV, NCCL_ENV]  # NCCL_NVLS_ENABLE=1 outside was overridden
    assert [r["rank"] for r in tp["ranks"]] == [0, 1] and tp["ranks"][0]["pid"] != tp["ranks"][1]["pid"]
    assert tp["merge_paths"] == [MERGE_GATHER]
    assert doc["provenance"]["contract"]["contract_version"]


@cpu_gloo_only
def test_det_gemm_tp2_bitwise_equal_to_tp1_and_simulated_split(tp_run, contract):
    _, doc, _ = tp_run
    (cell,) = _cells(doc, "forward_invariance", "det_gemm")
    d = cell["details"]
    assert cell["status"] == "green", cell["reason"]
    assert d["merge_path"] == MERGE_GATHER and d["world_size"] == 2 and d["rank_tree_depth"] == 1
    assert d["nan_policy"] == contract.nan_policy
    ids = [r["case"] for r in d["cases"]]
    assert len(ids) == 9 and "M1-K64-N64" in ids and "M33-K96-N64" in ids  # smoke q/o, gate/up, down shapes
    for r in d["cases"]:
        assert r["vs_tp1"]["passed"] and r["vs_tp1"]["differing"] == 0, r["vs_tp1"]
        assert r["vs_simulated"]["passed"] and r["simulated_vs_tp1_bitwise"]
        assert r["shard_bounds"] == mid_split_bounds(0, r["shape"]["K"], 1)
    assert d["inputs_identical_across_ranks"] and d["result_identical_across_ranks"]


@cpu_gloo_only
def test_fp32_merge_control_fails_the_equality(tp_run):
    _, doc, _ = tp_run
    (cell,) = _cells(doc, "forward_invariance_control", "det_gemm")
    assert cell["status"] == "green", cell["reason"]
    assert cell["details"]["merge_path"] == MERGE_FP32_CONTROL
    for r in cell["details"]["cases"]:
        assert not r["vs_tp1"]["passed"] and r["vs_tp1"]["differing"] > 0, r["case"]


@cpu_gloo_only
def test_chain_tp2_teacher_forcing_equals_single_process_rollout(tp_run):
    _, doc, _ = tp_run
    (cell,) = _cells(doc, "chain_parity", "chain")
    d = cell["details"]
    assert cell["status"] == "green", cell["reason"]
    assert d["profile"] == "strict" and d["strict"]["passed"] and d["ws1"]["passed"]
    assert d["metrics"]["strict_dlogp_zero"]["value"] == 0 and d["metrics"]["strict_dlogp_zero"]["passed"]
    assert d["bitwise_equal_tokens"] == d["active_tokens"] == 6 and d["max_abs_dlogp"] == 0
    assert d["tp_vs_single_teacher_forcing"]["passed"] and d["single_process_train_vs_rollout"]["passed"]
    assert d["linear_calls_per_rank"] == [d["linear_calls_expected"]] * 2 == [14, 14]  # 7 projections x 2 layers
    assert d["ranks_agree"] and d["weights_identical_across_ranks"] and d["first_divergence"] is None
    assert d["model"]["preset"] == "tiny-smoke" and d["fixture"]["name"] == "smoke"


@cpu_gloo_only
def test_chain_fp32_merge_control_fails_strict(tp_run):
    _, doc, _ = tp_run
    (cell,) = _cells(doc, "chain_parity_control", "chain")
    assert cell["status"] == "green", cell["reason"]
    assert not cell["details"]["strict"]["passed"]
    assert cell["details"]["bitwise_equal_tokens"] < cell["details"]["active_tokens"]


# ---------------------------------------------------------------- validation on every rank
@cpu_gloo_only
def test_bad_input_on_one_rank_raises_on_every_rank():
    before = {k: os.environ.get(k) for k in (*NCCL_ENV, "OPENBLAS_NUM_THREADS")}
    per_rank = launch(probe_validation, 2, "gloo")
    assert {k: os.environ.get(k) for k in before} == before  # the ranks' environment was set only around the spawn
    assert len(per_rank) == 2
    for rank, results in enumerate(per_rank):
        *bad, good = results
        assert good == {"case": "good call", "error": "", "message": "shape [3, 16]"}
        for r in bad:
            assert r["error"] == "InputError", (rank, r)
    by_case = [{r["case"]: r["message"] for r in results} for results in per_rank]
    assert "x_shard: expected dtype bfloat16" in by_case[1]["float32 x on the last rank"]
    assert "rank(s) [1] are invalid" in by_case[0]["float32 x on the last rank"]
    assert "M per rank [3, 2]" in by_case[0]["M differs on the last rank"]
    assert "not the contract's mid-split" in by_case[1]["K slices are not the mid-split"]
    assert "K_r differs" in by_case[0]["K_r of x and w differ on rank 0"]
    assert "merge must be" in by_case[1]["unknown merge"]
    assert "no tree_depth" in by_case[0]["backend without a tree depth"]
    assert "forward only" in by_case[0]["x requires grad"]


# ---------------------------------------------------------------- world size 4
@cpu_gloo_only
def test_world_size_4_tree_merge_equals_tp1():
    per_rank = launch(probe_det_gemm, 4, "gloo", 5, 75, 24, 3, (MERGE_GATHER, MERGE_FP32_CONTROL))
    for res in per_rank:
        assert res[MERGE_GATHER] == {"vs_tp1": True, "vs_simulated": True}
        assert res[MERGE_FP32_CONTROL]["vs_tp1"] is False
