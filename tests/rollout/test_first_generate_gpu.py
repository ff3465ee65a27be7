"""The first graph ``generate`` of a fresh process (issue #36): it used to fail with
``cudaErrorStreamCaptureInvalidated`` on a new process while later calls succeeded. Each case runs in
its own Python process whose first CUDA work after building the model is ``generate`` with default
settings (graphs on): the graphs must be captured (no fallback) and the tokens and logprobs must be
the eager step's bits. Control: a decode step that reads a device value on the host (not
capturable) makes the engine fall back loudly — a RuntimeWarning, ``cuda_graph`` False and the
reason in ``graph_fallback`` — and still return the eager bits; the same assertions that pass above
fail on it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from rl_engine.backends.registry import KERNEL_BACKENDS

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")

CHILD = r"""
import json, sys, warnings
import torch
preset, backend, poison = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
from rl_engine.chain.config import get_config
from rl_engine.chain.model import Qwen3Model
from rl_engine.chain.weights import synthetic_weights
from rl_engine.rollout import generate
from rl_engine.rollout import engine as engine_mod
from rl_engine.rollout.compare import compare_completions
if poison:  # NEGATIVE CONTROL: a host read of a device value inside the step cannot be captured
    plain = engine_mod.Engine._decode_step
    def poisoned(self, *args, **kwargs):
        out = plain(self, *args, **kwargs)
        out[0].sum().item()
        return out
    engine_mod.Engine._decode_step = poisoned
model = Qwen3Model(synthetic_weights(get_config(preset), 0, logit_scale=2.0, device="cuda"), backend)
prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    first = generate(model, prompts, 6)  # the first CUDA work after the weights: graphs on by default
eager = generate(model, prompts, 6, cuda_graph=False)
rep = compare_completions(eager.completions, first.completions)
print("RESULT " + json.dumps({"cuda_graph": first.cuda_graph, "graph_fallback": first.graph_fallback,
                              "decode_steps": first.decode_steps, "equal": rep.equal, "summary": rep.summary(),
                              "warnings": [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]}))
"""


def _first_generate(preset: str, backend: str, poison: bool) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, preset, backend, "1" if poison else "0"], capture_output=True,
                       text=True, timeout=600)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert p.returncode == 0 and line, p.stdout[-3000:] + p.stderr[-6000:]
    return json.loads(line[len("RESULT "):])


def _graphs_ran(res: dict) -> bool:
    return res["cuda_graph"] and res["graph_fallback"] is None and not res["warnings"]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("preset", ["tiny", "qwen3-8b"])
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_the_first_generate_of_a_fresh_process_replays_graphs_with_the_eager_bits(preset, backend):
    res = _first_generate(preset, backend, poison=False)
    assert res["decode_steps"] > 0 and res["equal"], res
    assert _graphs_ran(res), res


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_control_an_uncapturable_step_falls_back_loudly_with_the_eager_bits(backend):
    res = _first_generate("tiny", backend, poison=True)
    assert res["equal"], res
    assert not _graphs_ran(res), res
    assert res["cuda_graph"] is False and "capture" in (res["graph_fallback"] or ""), res
    assert any("eagerly" in w for w in res["warnings"]), res
