"""Running an implementation forward and backward, the same way for every op and backend.

Gradients: one seeded upstream gradient per output (same shape and dtype as the output; the
reference receives the same values upcast to FP32), then ``torch.autograd.backward``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from rl_engine.ops.spec import as_tuple, make_generator, standard_normal


def upcast_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Floating tensors -> FP32 copies of the same values (WS1 §3.1 condition 1); others as is."""
    out: dict[str, Any] = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            out[k] = v.detach().to(torch.float32)
        else:
            out[k] = v
    return out


def run_forward(impl: Callable[..., Any], inputs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return tuple(t.detach() for t in as_tuple(impl(**inputs)))


def make_upstream(outputs: Sequence[torch.Tensor], seed: int) -> tuple[torch.Tensor, ...]:
    """Seeded upstream gradients, one per floating output, in that output's dtype."""
    g = make_generator(seed)
    grads = []
    for o in outputs:
        if not o.is_floating_point():
            grads.append(torch.zeros(0))
            continue
        x = standard_normal(tuple(o.shape), g)
        grads.append(x.to(o.dtype).to(o.device))
    return tuple(grads)


def run_gradient(
    impl: Callable[..., Any],
    inputs: dict[str, Any],
    grad_inputs: Sequence[str],
    upstream: Sequence[torch.Tensor] | None = None,
    upstream_seed: int = 0,
) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
    """Forward with ``grad_inputs`` as leaves, then backward with the upstream gradients.

    ``upstream`` (if given) is cast to each output's dtype, so the reference sees the same
    values in FP32, and copied, so an implementation that writes its incoming gradient in place
    cannot change the caller's tensor. Returns ``(outputs, grads_by_input_name, upstream_used)``.
    """
    leaves = {}
    call = dict(inputs)
    for name in grad_inputs:
        leaf = inputs[name].detach().clone().requires_grad_(True)
        leaves[name] = leaf
        call[name] = leaf
    with torch.enable_grad():
        outs = as_tuple(impl(**call))
        if upstream is None:
            upstream = make_upstream(outs, upstream_seed)
        used = []
        pairs_o, pairs_g = [], []
        for o, g in zip(outs, upstream):
            # A private copy per call: some backends write their input gradient in place (Liger's
            # RoPE backward rotates dy where it lies), which would corrupt the caller's upstream for
            # every later run that shares it (seen on the H200 as false gradient_invariance reds).
            g = g.to(o.dtype, copy=True) if o.is_floating_point() else g.clone()
            used.append(g)
            if o.requires_grad:
                pairs_o.append(o)
                pairs_g.append(g)
        if pairs_o:
            torch.autograd.backward(pairs_o, pairs_g)
    grads = {}
    for name, leaf in leaves.items():
        grads[name] = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
    return tuple(o.detach() for o in outs), grads, tuple(used)
