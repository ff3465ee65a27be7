"""The kernels of an earlier commit, read from git history at test time (never copied into the tree).

The masked-means-absent tests compare against the attention kernels of commit 7892be7, the last
commit before masked positions became absent: as negative controls (the old kernels must fail the
new checks) and to show that finite inputs keep their bits. The sources come from ``git show``;
where the checkout has no history (a copied tree, a shallow clone) the tests that need them skip
with that reason.
"""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

LEGACY_COMMIT = "7892be7"
ROOT = Path(__file__).resolve().parents[2]


def _git_show(path: str) -> str:
    try:
        proc = subprocess.run(["git", "-C", str(ROOT), "show", f"{LEGACY_COMMIT}:{path}"],
                              capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"git is not usable here ({exc}): the {LEGACY_COMMIT} kernels cannot be read")
    if proc.returncode != 0:
        pytest.skip(f"commit {LEGACY_COMMIT} is not in this checkout's history ({proc.stderr.strip()[:120]})")
    return proc.stdout


def legacy_cuda_sources(dest: Path) -> Path:
    """Write every ``.cu``/``.cuh`` of ``rl_engine/backends/cuda_src`` at the legacy commit into ``dest``."""
    listing = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{LEGACY_COMMIT}",
                              "rl_engine/backends/cuda_src/"], capture_output=True, text=True, check=False)
    if listing.returncode != 0:
        pytest.skip(f"commit {LEGACY_COMMIT} is not in this checkout's history")
    dest.mkdir(parents=True, exist_ok=True)
    for path in listing.stdout.split():
        if path.endswith((".cu", ".cuh")):
            (dest / Path(path).name).write_text(_git_show(path))
    return dest


class _FusionOff:
    """``kernel[grid](...)`` with ``enable_fp_fusion=False``, the contract's FP contraction policy
    (ws1-c1-v4): the old module launched with Triton's default, so without this the comparison
    on the GPU would also see the fusion change, not only the masking change."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *args, **kwargs: launch(*args, **{"enable_fp_fusion": False, **kwargs})


def legacy_attention_triton(dest: Path):
    """The legacy ``rl_engine/ops/attention/triton.py`` as a module, its launches with fusion off."""
    path = dest / f"attention_triton_{LEGACY_COMMIT}.py"
    path.write_text(_git_show("rl_engine/ops/attention/triton.py"))
    spec = importlib.util.spec_from_file_location(f"legacy_attention_triton_{LEGACY_COMMIT}_{abs(hash(dest))}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in dir(mod):
        if name.startswith("_attn_") and name.endswith("_kernel"):
            setattr(mod, name, _FusionOff(getattr(mod, name)))
    return mod
