"""The cuda_bf16 build: every .cu compiles for sm_90a, the cache key follows the sources, concurrent
builds are safe, the exported prototypes parse, and the sources stay framework-free and IEEE.

Needs ``nvcc`` (skipped with the reason otherwise); no GPU. The full compile check prints the
per-file compile times and the ptxas register / spill report.
"""

from __future__ import annotations

import multiprocessing as mp
import re
import shutil
from pathlib import Path

import pytest

from rl_engine.backends import cuda_build

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the CUDA sources cannot be compile-checked")

TINY_SOURCE = """
#include <cuda_runtime.h>
#include <stdint.h>
#define RL_EXPORT extern "C" __attribute__((visibility("default")))
__global__ void tiny_kernel(float* x) { x[threadIdx.x] += 1.0f; }
RL_EXPORT int rl_abi_version(void) { return %d; }
RL_EXPORT const char* rl_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }
RL_EXPORT int rl_tiny(void* x, int64_t n, void* stream) {
    tiny_kernel<<<1, static_cast<unsigned>(n), 0, static_cast<cudaStream_t>(stream)>>>(static_cast<float*>(x));
    return static_cast<int>(cudaGetLastError());
}
"""


def _tiny_sources(tmp: Path, marker: int = 0) -> Path:
    src = tmp / "src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "tiny.cu").write_text(TINY_SOURCE % cuda_build.ABI_VERSION + f"// marker {marker}\n")
    return src


@needs_nvcc
def test_cache_key_changes_when_a_source_changes(tmp_path):
    src = _tiny_sources(tmp_path, 0)
    k0 = cuda_build.cache_key(src)
    assert k0 == cuda_build.cache_key(src)
    (src / "tiny.cu").write_text((src / "tiny.cu").read_text() + "// edit\n")
    k1 = cuda_build.cache_key(src)
    assert k1 != k0
    (src / "extra.cuh").write_text("#pragma once\n")
    assert cuda_build.cache_key(src) not in (k0, k1)
    assert cuda_build.cache_key(src, flags=cuda_build.NVCC_FLAGS + ("-DX=1",)) != cuda_build.cache_key(src)


def test_real_sources_key_covers_every_file():
    files = {p.name for p in cuda_build.source_files()}
    assert {"common.cuh", "elementwise.cu", "norm.cu", "gemm.cu", "logprob.cu", "attention.cu"} <= files


def _build_in_process(args):
    src, root = args
    res = cuda_build.build(src_dir=Path(src), cache_root=Path(root))
    return str(res.path), res.cached, res.key


@needs_nvcc
def test_concurrent_builds_both_succeed(tmp_path):
    src = _tiny_sources(tmp_path, 1)
    root = tmp_path / "cache"
    ctx = mp.get_context("spawn")
    with ctx.Pool(2) as pool:
        out = pool.map(_build_in_process, [(str(src), str(root))] * 2)
    paths = {p for p, _, _ in out}
    assert len(paths) == 1
    lib = Path(paths.pop())
    assert lib.is_file() and lib.name == cuda_build.LIBRARY_NAME
    assert sorted(c for _, c, _ in out) == [False, True]  # one built, the other found it under the lock
    leftovers = [p.name for p in root.iterdir() if p.name.startswith(".build-")]
    assert not leftovers
    again = cuda_build.build(src_dir=src, cache_root=root)
    assert again.cached and again.path == lib
    assert set(again.compile_seconds) == {"tiny.cu"} and again.build_seconds > 0


@needs_nvcc
def test_failed_build_leaves_nothing_and_names_the_file(tmp_path):
    src = _tiny_sources(tmp_path, 2)
    (src / "broken.cu").write_text("this is not C++\n")
    root = tmp_path / "cache"
    with pytest.raises(cuda_build.CudaBuildError, match="broken.cu"):
        cuda_build.build(src_dir=src, cache_root=root)
    assert not any(root.rglob(cuda_build.LIBRARY_NAME))


def test_prototypes_parse_and_are_unique():
    protos = cuda_build.parse_prototypes()
    assert "rl_abi_version" in protos and "rl_cuda_error_string" in protos
    for name, (ret, args) in protos.items():
        assert ret in ("int", "int64_t", "const char*"), name
        if ret == "int" and name != "rl_abi_version":
            assert args and args[-1] == ("void*", "stream"), f"{name}: the stream must be the last argument"
    # Every launcher the Python side names exists in the sources.
    root = Path(cuda_build.__file__).resolve().parents[1] / "ops"
    used = set()
    for py in root.glob("*/cuda.py"):
        used |= set(re.findall(r"\"(rl_\w+)\"", py.read_text()))
    assert used and used <= set(protos), sorted(used - set(protos))


def test_sources_are_framework_free_and_ieee():
    for p in cuda_build.source_files():
        text = p.read_text()
        assert not re.search(r"#include\s*[<\"](torch|ATen|c10|pybind11)", text), p.name
        assert not re.search(r"\batomic\w*\s*\(", text), f"{p.name} calls an atomic"
    flags = " ".join(cuda_build.NVCC_FLAGS)
    assert "fast_math" not in flags and "fast-math" not in flags
    assert "-gencode=arch=compute_90a,code=sm_90a" in cuda_build.NVCC_FLAGS
    assert "-fmad=false" in cuda_build.NVCC_FLAGS
    assert cuda_build.source_abi_version() == cuda_build.ABI_VERSION


@needs_nvcc
def test_library_builds_loads_and_exports_constants():
    """The real library links and loads with ctypes (no GPU needed to load it); its constants are
    the ones the Python side relies on. Uses the normal cache, so a second run is instant."""
    res = cuda_build.build()
    assert res.path.is_file() and res.build_seconds > 0
    # every .cu file was compiled for sm_90a by the build that produced the library (this also
    # holds when the library came from the cache: the record is that build's)
    assert sorted(res.compile_seconds) == sorted(p.name for p in cuda_build.cu_files())
    print(f"librl_cuda.so: cached={res.cached}, this call {res.seconds:.1f} s, build {res.build_seconds:.1f} s, "
          f"per file {', '.join(f'{k} {v:.1f} s' for k, v in sorted(res.compile_seconds.items()))}")
    lib = cuda_build.CudaLibrary(res)
    assert lib.query("rl_logp_chunk_v") == 4096
    assert lib.query("rl_attention_block_kv") == 64
    assert lib.query("rl_attention_block_q") == 64
    assert lib.query("rl_rms_norm_dw_chunks", 65) == 2
    assert lib.error_string(0)
    with pytest.raises(cuda_build.RLEngineError, match="takes"):
        lib.call("rl_silu_fwd", None)
