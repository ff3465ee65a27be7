"""Start ranks for the tensor-parallel checks: ``torch.multiprocessing`` spawn, or torchrun's env.

* :func:`launch` spawns ``world_size`` processes on this host, initialises a process group
  (``nccl``: one GPU per rank, ``cuda:<rank>``; ``gloo``: CPU), runs ``target(ctx, *args)`` on every
  rank and returns each rank's (CPU, picklable) result in rank order.
* :func:`init_from_env` joins a group started by ``torchrun`` (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``).

Both set :data:`NCCL_ENV` in the environment of every rank before the group exists: NVLink
SHARP / multicast off for NCCL, torch symmetric memory and NVSHMEM (the settings the two-GPU
H200 machine needs; NVLS would also move the reduction into the switch, whose arithmetic is not
the contract's merge). :func:`launch` sets them only around the spawn (the caller's environment is
restored), and gives gloo ranks ``cores // world_size`` BLAS / OpenMP threads each.

Also here: :func:`probe_validation`, a rank function that feeds ``row_parallel_det_gemm`` bad
inputs on one rank at a time and returns what each rank raised (every rank must raise, none may
hang), used by the tests.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl_engine import env

from rl_engine.errors import RLEngineError
from rl_engine.ops.spec import standard_normal

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""Set (overriding any other value) for every rank before the process group is created."""

RECORDED_ENV = (*NCCL_ENV, "NCCL_ALGO", "NCCL_PROTO", "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE",
                "NCCL_IB_DISABLE", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "CUDA_VISIBLE_DEVICES",
                "TRITON_INTERPRET", "GLOO_SOCKET_IFNAME", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""Variables recorded per rank in the provenance (NCCL_ALGO / NCCL_PROTO can change a reduction's order)."""

DEFAULT_TIMEOUT_S = 1800

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
"""Thread counts of the BLAS / OpenMP pools. CPU (gloo) ranks get ``cores // world_size`` each unless
already set: NumPy's BLAS under the Triton interpreter otherwise starts one thread per core in every
rank, and two ranks on two cores ran 2.5x slower oversubscribed."""


def apply_nccl_env() -> dict[str, str]:
    """Set :data:`NCCL_ENV` in ``os.environ`` (inherited by spawned ranks) and return it."""
    env.set_variables(NCCL_ENV)
    return dict(NCCL_ENV)


def rank_env() -> dict[str, str | None]:
    """This process's values of :data:`RECORDED_ENV` (None when unset)."""
    return env.get_variables(RECORDED_ENV)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the rendezvous of spawned ranks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RankContext:
    """One rank's view: its rank, the world size, the device it computes on, the group (None =
    the default group) and how it was started (``spawn`` or ``torchrun``)."""

    rank: int
    world_size: int
    local_rank: int
    dist_backend: str
    device: torch.device
    launcher: str
    group: Any = None

    def describe(self) -> dict[str, Any]:
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        return {"rank": self.rank, "local_rank": self.local_rank, "device": str(self.device), "device_name": name,
                "pid": os.getpid(), "env": rank_env()}


def check_launch(world_size: int, dist_backend: str) -> None:
    """Raise RLEngineError when ``dist_backend`` cannot run ``world_size`` ranks here."""
    import torch.distributed as dist

    from rl_engine.tp.row_parallel import check_world_size

    check_world_size(world_size)
    if not dist.is_available():
        raise RLEngineError("torch.distributed is not available in this torch build")
    if dist_backend == "nccl":
        if not dist.is_nccl_available():
            raise RLEngineError("backend nccl: this torch build has no NCCL")
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < world_size:
            raise RLEngineError(f"backend nccl: {world_size} ranks need {world_size} CUDA GPUs, this machine has {n}")
    elif dist_backend == "gloo":
        if not dist.is_gloo_available():
            raise RLEngineError("backend gloo: this torch build has no Gloo")
    else:
        raise RLEngineError(f"unknown torch.distributed backend {dist_backend!r}; use nccl or gloo")


def init_rank(rank: int, world_size: int, dist_backend: str, init_method: str, local_rank: int,
              launcher: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> RankContext:
    """Join the process group as ``rank`` (sets :data:`NCCL_ENV` first). On nccl the rank computes
    on ``cuda:<local_rank>``; on gloo on the CPU with ``cores // world_size`` intra-op threads."""
    import torch.distributed as dist

    apply_nccl_env()
    kwargs: dict[str, Any] = {}
    if dist_backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        kwargs["device_id"] = device
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group(dist_backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return RankContext(rank, world_size, local_rank, dist_backend, device, launcher)


def init_from_env(dist_backend: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> RankContext:
    """Join a group started by torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_*``)."""
    try:
        found = env.torchrun_rank()
    except ValueError as exc:
        raise RLEngineError(f"torchrun environment malformed: {exc}") from exc
    if found is None:
        raise RLEngineError("torchrun environment incomplete: RANK, WORLD_SIZE and LOCAL_RANK are needed")
    rank, ws, local = found
    return init_rank(rank, ws, dist_backend, "env://", local, "torchrun", timeout_s)


def launched_by_torchrun() -> bool:
    """True when this process was started by torchrun (RANK and WORLD_SIZE in the environment)."""
    try:
        return env.torchrun_rank() is not None
    except ValueError:
        return True  # present but malformed: init_from_env reports it


def finish_rank() -> None:
    """Barrier, then destroy the process group."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def _entry(rank: int, world_size: int, dist_backend: str, port: int, out_dir: str,
           target: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> None:
    ctx = init_rank(rank, world_size, dist_backend, f"tcp://127.0.0.1:{port}", rank, "spawn", timeout_s)
    try:
        result = target(ctx, *args)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    finally:
        finish_rank()


@contextlib.contextmanager
def rank_environment(world_size: int, dist_backend: str) -> Iterator[dict[str, str]]:
    """While ranks are spawned: :data:`NCCL_ENV` set (overriding), and for gloo ranks the unset
    :data:`THREAD_VARS` set to ``cores // world_size``; the previous values are restored afterwards.
    Yields the variables it set."""
    changes = dict(NCCL_ENV)
    if dist_backend == "gloo":
        per_rank = str(max(1, (os.cpu_count() or 1) // world_size))
        unset = [k for k, v in env.get_variables(THREAD_VARS).items() if v is None]
        changes.update({k: per_rank for k in unset})
    before = env.set_variables(changes)
    try:
        yield changes
    finally:
        env.restore_variables(before)


def launch(target: Callable[..., Any], world_size: int, dist_backend: str, *args: Any,
           timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Any]:
    """Spawn ``world_size`` ranks, run ``target(ctx, *args)`` on each, return the results in rank order.

    ``target`` must be importable by module path (spawned processes re-import it) and return CPU,
    picklable values. A rank that raises makes this raise
    ``torch.multiprocessing.ProcessRaisedException`` with that rank's traceback.

    Raises
    ------
    RLEngineError
        The backend cannot run ``world_size`` ranks here (see :func:`check_launch`).
    InputError
        ``world_size`` is not one of the contract's supported splits.
    """
    import torch.multiprocessing as mp

    check_launch(world_size, dist_backend)
    with tempfile.TemporaryDirectory(prefix="rl-engine-tp-") as d, rank_environment(world_size, dist_backend):
        mp.spawn(_entry, args=(world_size, dist_backend, free_port(), d, target, args, timeout_s),
                 nprocs=world_size, join=True)
        return [torch.load(Path(d) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]


# -- probes (rank functions used by the tests) ---------------------------------------------------
def probe_validation(ctx: RankContext) -> list[dict[str, str]]:
    """Feed ``row_parallel_det_gemm`` a bad input on one rank (or bad options on all) and record
    what this rank raised for each case; finish with a good call, which must still work (no rank
    was left inside a collective). Returns ``[{case, error, message}]`` ending with the good call."""
    from rl_engine.errors import InputError
    from rl_engine.tp.row_parallel import row_parallel_det_gemm, shard_bounds

    dev = ctx.device
    g = torch.Generator(device="cpu").manual_seed(5)
    m, k, n = 3, 40, 16
    x = standard_normal((m, k), g).to(torch.bfloat16).to(dev)
    b = (standard_normal((k, n), g) * k ** -0.5).to(torch.bfloat16).to(dev)
    bounds = shard_bounds(k, ctx.world_size)
    lo, hi = bounds[ctx.rank], bounds[ctx.rank + 1]
    xr, br = x[:, lo:hi], b[lo:hi, :]
    last = ctx.world_size - 1
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("float32 x on the last rank",
         lambda: row_parallel_det_gemm(xr.float() if ctx.rank == last else xr, br, ctx.group)),
        ("M differs on the last rank",
         lambda: row_parallel_det_gemm(xr[:2] if ctx.rank == last else xr, br, ctx.group)),
        ("K slices are not the mid-split",
         lambda: row_parallel_det_gemm(x[:, :hi + 1] if ctx.rank == 0 else x[:, lo + 1:hi],
                                       b[:hi + 1] if ctx.rank == 0 else b[lo + 1:hi], ctx.group)),
        ("K_r of x and w differ on rank 0",
         lambda: row_parallel_det_gemm(xr, br[:-1] if ctx.rank == 0 else br, ctx.group)),
        ("unknown merge", lambda: row_parallel_det_gemm(xr, br, ctx.group, merge="fp64_sum")),
        ("backend without a tree depth", lambda: row_parallel_det_gemm(xr, br, ctx.group, backend="torch_bf16")),
        ("x requires grad", lambda: row_parallel_det_gemm(xr.detach().requires_grad_(True), br, ctx.group)),
    ]
    out: list[dict[str, str]] = []
    for name, call in cases:
        try:
            call()
            out.append({"case": name, "error": "", "message": "no error"})
        except InputError as exc:
            out.append({"case": name, "error": type(exc).__name__, "message": str(exc)})
    with torch.no_grad():
        good = row_parallel_det_gemm(xr, br, ctx.group)
    out.append({"case": "good call", "error": "", "message": f"shape {list(good.shape)}"})
    return out


def probe_det_gemm(ctx: RankContext, m: int, k: int, n: int, seed: int,
                   merges: tuple[str, ...]) -> dict[str, dict[str, bool]]:
    """On every rank: seeded ``a [M, K]``, ``b [K, N]`` (bfloat16, drawn on the CPU), the real
    row-parallel product for each merge path, compared bitwise with the TP=1 product and the
    simulated split. Returns ``{merge: {"vs_tp1": bool, "vs_simulated": bool}}``."""
    from rl_engine.ops.det_gemm import tp_split_det_gemm
    from rl_engine.ops.det_gemm.api import det_gemm_triton
    from rl_engine.tp.row_parallel import row_parallel_full

    g = torch.Generator(device="cpu").manual_seed(seed)
    a = standard_normal((m, k), g).to(torch.bfloat16).to(ctx.device)
    b = (standard_normal((k, n), g) * k ** -0.5).to(torch.bfloat16).to(ctx.device)
    iv = torch.int16
    out: dict[str, dict[str, bool]] = {}
    with torch.no_grad():
        tp1 = det_gemm_triton(a, b).view(iv)
        sim = tp_split_det_gemm(a, b, ctx.world_size, det_gemm_triton).view(iv)
        for merge in merges:
            real = row_parallel_full(a, b, ctx.group, merge=merge).view(iv)
            out[merge] = {"vs_tp1": bool(torch.equal(real, tp1)), "vs_simulated": bool(torch.equal(real, sim))}
    return out
