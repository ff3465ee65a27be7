"""CUDA C++ causal varlen GQA attention (``cuda_bf16`` backend): forward, deterministic backward,
and one decode step against a static KV cache.

Two families of kernels, chosen per process (:func:`set_fwd_form`, :func:`set_bwd_form`):

* **declared** (the library's default since contract ws1-c1-v8, head dims 64 and 128;
  ``rl_engine/backends/cuda_src/attention_tc.cu``): the Triton backend's kernels with
  ``ROW_SUM_PINNED`` written out in CUDA, so both backends give the same bits
  (``docs/declared-arithmetic.md``, "Attention"): one warpgroup per 64-row tile, ``S`` / ``dP`` on
  wgmma m64n64k16 from shared memory, ``P`` / ``dS`` rounded to BF16 in registers for the wgmma
  m64nDk16 products, ``tl.exp`` as ``ex2.approx.f32`` of ``x * log2 e``, the row sums in
  ``fragment_row_sum``'s order, masked terms absent. A decode step is the same walk over the
  group's query heads padded to 64 rows (:data:`DECLARED_DECODE_FORMS`: one kernel, or the split
  step with the same bits).
* **fma / tensor_cores** (the defaults up to ws1-c1-v7, and the only kernels for head dims 16, 32 and
  256; ``attention.cu`` and ``attention_bwd.cu``), described below.

Forward (the ``fma`` form): one block of 256 threads per 64 queries of one head (prefill); a decode step computes the
same per-row function in one of two forms (``attention.cu``): two launches (scores of every key
first, then the walk over the key blocks), or one launch per (sequence, KV head) that pipelines the
scores, softmax and ``P V`` of each key block (the library's form from 128 blocks up). The keys of a sequence are visited in the fixed blocks
``[0, 64), [64, 128), ...`` in increasing order in every path. Scores are FMA chains over D in
order, times ``scale``; per block and row: ``m_new = max(m, block max)``, ``alpha = 1`` if the max
did not move else ``exp(m - m_new)``, ``p = exp(s - m_new)`` (FP32, not rounded), ``l = l * alpha +
rowsum(p)`` with a fixed 16-lane reduction, ``o = o * alpha`` then ``o = fma(p_j, v_j, o)`` in key
order; finally ``out = o / l`` (IEEE division) rounded once to BF16, 0 for a row with no visible key
(``docs/pitfalls.md`` P10), and ``lse = m + log(l)`` kept for the backward. A KV block wholly past a row's
causal limit leaves that row's state bitwise unchanged, and prefill and decode call the same
per-row code with the same block size, so a query's output is bitwise the same in a full prefill,
a chunked prefill or a decode step (``docs/pitfalls.md`` P8); the declared form keeps the same
property. The scores of a decode step are
computed in parallel over the keys, but every sum over the keys runs in the forward's order; no
split of any sum over the KV axis, and every launch constant that sets bits is fixed.

Backward (FlashAttention-2 structure, Dao 2023; deterministic, no atomics): ``delta =
rowsum(dO * O)``; a dQ kernel per 64 queries of one head (KV blocks in increasing order) and a
dK/dV kernel per 64 keys of one KV head (query heads of the group in order, queries in increasing
order), each gradient element a sequential FP32 FMA chain, ``scale`` applied once at the end,
rounded once to BF16 (form ``fma``). In the tensor-core form (the default up to ws1-c1-v7;
:data:`BWD_FORMS`, :func:`set_bwd_form`) the same
kernels' structure runs on ``mma.sync`` m16n8k16: ``S`` and ``dP`` as k16 products over D, ``P`` and
``dS`` (FP32, as above) rounded to BF16 for the ``dV``, ``dK`` and ``dQ`` products over the block's 64
queries / keys (the Triton backend's scheme, FlashAttention-2's); masked terms stay absent.

Head dim: D in {16, 32, 64, 128, 256} (a kernel template per size).
"""

from __future__ import annotations

import torch

from rl_engine.backends.cuda_launch import launch, query
from rl_engine.ops.attention._checks import LaunchPlan

HEAD_DIMS = (16, 32, 64, 128, 256)
"""Head dims with a compiled kernel (checked by the op's validation before any launch)."""


def attention_fwd(q, k, v, cu_q, cu_k, scale: float, plan: LaunchPlan, *,
                  block_n: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the varlen forward; returns (out [Tq, H, D] bf16, lse [H, Tq] fp32). ``block_n`` (the
    Triton negative control's knob) must be 0: the KV block of this backend is a kernel constant."""
    if block_n:
        raise ValueError("the KV block size of cuda_bf16 is fixed; only the Triton negative control varies it")
    tq, h, d = q.shape
    hkv = k.shape[1]
    out = torch.empty((tq, h, d), dtype=torch.bfloat16, device=q.device)
    lse = torch.empty((h, tq), dtype=torch.float32, device=q.device)
    if tq == 0 or plan.batch == 0:
        return out, lse
    bq = query("rl_attention_block_q")
    n_mblocks = -(-plan.max_lq // bq)
    launch(q.device, "rl_attention_fwd", q, k, v, out, lse, cu_q, cu_k, plan.batch, n_mblocks, h, hkv, d,
           q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
           lse.stride(0), float(scale))
    return out, lse


def attention_bwd(q, k, v, out, lse, do, cu_q, cu_k, scale: float, plan: LaunchPlan):
    """Launch the deterministic backward; returns (dq, dk, dv) bf16 (do bf16, unit stride on D)."""
    tq, h, d = q.shape
    tk, hkv, _ = k.shape
    # Every row is written by a kernel (every token belongs to a sequence), so no zero fill.
    dq = torch.empty((tq, h, d), dtype=torch.bfloat16, device=q.device)
    dk = torch.empty((tk, hkv, d), dtype=torch.bfloat16, device=q.device)
    dv = torch.empty((tk, hkv, d), dtype=torch.bfloat16, device=q.device)
    if tk == 0 or plan.batch == 0:
        return dq, dk, dv
    delta = torch.empty((h, tq), dtype=torch.float32, device=q.device)
    launch(q.device, "rl_attention_bwd_delta", out, do, delta, tq, h, d, out.stride(0), out.stride(1),
           do.stride(0), do.stride(1), delta.stride(0))
    bq = query("rl_attention_block_q")
    bkv = query("rl_attention_block_kv")
    n_mblocks = -(-plan.max_lq // bq)
    n_nblocks = -(-plan.max_lk // bkv)
    launch(q.device, "rl_attention_bwd", q, k, v, do, lse, delta, dq, dk, dv, cu_q, cu_k, plan.batch, n_mblocks,
           n_nblocks, h, hkv, d, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
           do.stride(0), do.stride(1), lse.stride(0), dq.stride(0), dq.stride(1), dk.stride(0), dk.stride(1),
           dv.stride(0), dv.stride(1), float(scale))
    return dq, dk, dv


BWD_FORMS = {"fma": 0, "tensor_cores": 1, "declared": 2}
"""Forms of the backward (``rl_attention_bwd_form`` in ``attention_bwd.cu``): ``fma`` = every
gradient element a sequential FP32 FMA chain on CUDA cores; ``tensor_cores``, the library's default
under contract ``ws1-c1-v7``, = ``attn_bwd_dq_tc_kernel`` /
``attn_bwd_dkdv_tc_kernel`` for head dims 16 to 128 (D = 256 runs ``fma``): 41 against 539 ms of
attention backward in a Qwen3-8B train step at 4 x 1024 tokens on the H200
(``evidence/2026-12-04-h200-issue33-dc3e9ba/``); ``declared`` = ``attention_tc.cu``'s backward for
head dims 64 and 128 (others take ``tensor_cores``' rule): the Triton backend's backward with
``ROW_SUM_PINNED`` written out in CUDA on wgmma (``delta`` in ``_head_dim_sum``'s order, ``tl.exp``,
``P`` and ``dS`` rounded to BF16 in registers), so that with the ``declared`` forward
(:data:`FWD_FORMS`) both backends give the same gradient bits: the library's default since contract
``ws1-c1-v8`` (its ``declared_fma.attention``). All are deterministic and batch-invariant; their bits
differ."""


def set_bwd_form(form: str) -> str:
    """Make every later ``cuda_bf16`` attention backward of this process run in ``form`` (one of
    :data:`BWD_FORMS`); returns the previous form.

    Raises:
        InputError: ``form`` not one of :data:`BWD_FORMS`."""
    return _set_named_form("attention backward form", "rl_attention_bwd_form", BWD_FORMS, form)


def _set_named_form(what: str, export: str, forms: dict[str, int], form: str) -> str:
    """Check ``form`` against ``forms`` (InputError naming ``what``), pass its number to the library's
    ``export`` and return the name of the previous one."""
    from rl_engine.errors import InputError

    if form not in forms:
        raise InputError(f"{what}: expected one of {sorted(forms)}, got {form!r}")
    old = query(export, forms[form])
    return {v: k for k, v in forms.items()}[old]


FWD_FORMS = {"fma": 0, "declared": 1}
"""Forms of the forward and decode step (``rl_attention_fwd_form`` in ``attention_tc.cu``): ``fma``
= ``attention.cu``'s kernels on CUDA cores (FP32 FMA chains, ``P`` kept in
FP32 for ``P V``); ``declared`` = ``attention_tc.cu`` for head dims 64 and 128 (other head dims
keep ``fma``): the Triton backend's forward with ``ROW_SUM_PINNED`` written out in CUDA, one
warpgroup per 64-row tile, ``S`` and ``P V`` on wgmma, ``P`` rounded to BF16, Triton's ``tl.exp``
(``ex2.approx.f32``) and its pinned row-sum order (docs/declared-arithmetic.md, "Attention"), so that
both backends can give the same bits. The prefill and every decode step take the same form (a
query's prefill and decode rows stay bitwise equal); the two forms' bits differ. ``declared`` is the
library's default since contract ``ws1-c1-v8``."""


def set_fwd_form(form: str) -> str:
    """Make every later ``cuda_bf16`` attention forward and decode step of this process run in
    ``form`` (one of :data:`FWD_FORMS`); returns the previous form.

    Raises:
        InputError: ``form`` not one of :data:`FWD_FORMS`."""
    return _set_named_form("attention forward form", "rl_attention_fwd_form", FWD_FORMS, form)


DECODE_FORMS = {"auto": 0, "two_launch": 1, "one_pass": 2}
"""Forms of a decode step (``rl_attention_decode_form`` in ``attention.cu``): ``auto`` is the
library's choice (the one-pass kernel from ``DECODE_ONE_PASS_MIN_BLOCKS`` blocks up)."""


def set_decode_form(form: str) -> str:
    """Make every later decode step of this process that leaves the form to the library
    (``form="auto"``, the op's and the engine's case) take ``form`` (one of :data:`DECODE_FORMS`;
    ``"auto"`` restores the library's rule); returns the previous setting. For tests that run a
    whole engine in one form: the bits do not depend on it.

    Raises:
        InputError: ``form`` not one of :data:`DECODE_FORMS`."""
    return _set_named_form("decode form", "rl_attention_decode_default_form", DECODE_FORMS, form)


ONE_PASS_STAGES = (3, 6)
"""Ring depths of the one-pass form at D <= 128 (2 and 3 at D = 256): the shallow ring lets two
blocks share an SM, the deep one is the library's choice for grids of at most 132 blocks."""


def set_one_pass_stages(stages: int) -> int:
    """Make every later one-pass decode launch of this process use ring depth ``stages`` (one of
    :data:`ONE_PASS_STAGES`, 2 at D = 256; 0: the library's choice); returns the previous value. For
    tests and ``tools/attention_decode_sweep.py``: the bits do not depend on it.

    Raises:
        InputError: ``stages`` not 0, 2, 3 or 6."""
    from rl_engine.errors import InputError

    if isinstance(stages, bool) or stages not in (0, 2, *ONE_PASS_STAGES):
        raise InputError(f"one-pass stages: expected 0, 2, 3 or 6, got {stages!r}")
    return query("rl_attention_one_pass_stages", int(stages))


DECLARED_DECODE_FORMS = {"auto": 0, "walk": 1, "split": 2}
"""Forms of the declared form's decode step (``rl_attention_declared_decode_form`` in
``attention_tc.cu``): ``walk``, one kernel per (sequence, KV head, 64-head tile) walking the key
blocks in order (the prefill's ``tf_walk``); ``split``, the same values in three launches: per key
block in parallel the scores and row maxima, then the probabilities (BF16), rescale factors and row
sums, then per (sequence, KV head, tile) the remaining chain ``l = l * alpha + sum``,
``acc = acc * alpha + P V`` over the blocks in order, through an FP32 / BF16 scratch allocated here.
Every value comes from the same instructions on the same operands, so the bits are the walk's
(tested). ``auto`` is the library's choice: the split step where the walk would run at most 8 blocks
(B x KV heads x tiles; e.g. B = 1 at Qwen3-8B heads) with at most 64 MiB of scratch, the walk
otherwise (``TS_AUTO_MAX_WALK_BLOCKS`` in ``attention_tc.cu``, from the H200 timing it cites)."""


def set_declared_decode_form(form: str) -> str:
    """Make every later decode step of this process in the declared attention form run as
    ``form`` (one of :data:`DECLARED_DECODE_FORMS`); returns the previous setting. For tests and the
    timing tool: the bits do not depend on it.

    Raises:
        InputError: ``form`` not one of :data:`DECLARED_DECODE_FORMS` (before any launch)."""
    return _set_named_form("declared decode form", "rl_attention_declared_decode_form", DECLARED_DECODE_FORMS, form)


def attention_decode_fwd(q, k_cache, v_cache, cache_seqlens, scale: float, *, d_split: int = 0,
                         form: str = "auto") -> torch.Tensor:
    """Launch one decode step; returns out [B, H, D] bf16 (validated inputs, no host reads).

    Two forms compute the same function (``attention.cu``, decode; the same bits, tested):
    ``two_launch``, the scores of every (head, key) into an FP32 scratch [B, H, ceil(S_max / 64) * 64]
    allocated here, then one sequential walk over the 64-key blocks per (sequence, KV head, column
    slice) with the per-row softmax and ``P V`` chains of the forward; ``one_pass``, one block per
    (sequence, KV head) that computes the scores, softmax and ``P V`` of each 64-key block in a
    pipeline (no scratch: only a 0-element placeholder is allocated). ``form="auto"`` is the library's choice from B and the head shapes.
    ``d_split`` (two launches only; 0: the library's choice, ``DECODE_PV_BLOCKS`` in attention.cu):
    column slices per (sequence, KV head), 1, 2, 4 or 8 with at least 16 columns each; the bits
    depend on neither, they are parameters for tests and the sweep tool.

    In the declared forward form (:func:`set_fwd_form`, head dims 64 and 128) a decode step runs
    that form's decode (:data:`DECLARED_DECODE_FORMS`: the walk, or the split step whose FP32 / BF16
    scratch of the library's size is allocated here): ``form`` must be ``"auto"`` and ``d_split`` 0
    there.

    Raises:
        InputError: ``form`` not one of ``DECODE_FORMS``, ``d_split`` given with a form other
            than ``two_launch``, or either given in the declared forward form (before any launch)."""
    from rl_engine.errors import InputError

    if form not in DECODE_FORMS:
        raise InputError(f"form must be one of {sorted(DECODE_FORMS)}, got {form!r}")
    if d_split and form != "two_launch":
        raise InputError(f"d_split {d_split} applies to the two_launch form only, got form {form!r}")
    bsz, h, d = q.shape
    declared = query("rl_attention_fwd_uses_tc", d) == 1
    if declared and (form != "auto" or d_split):
        raise InputError(f"the declared attention forward form runs one decode kernel: form {form!r} and "
                         f"d_split {d_split} are forms of the CUDA-core decode (set_fwd_form('fma') for them)")
    s_max, hkv = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty((bsz, h, d), dtype=torch.bfloat16, device=q.device)
    if bsz == 0:
        return out
    bkv = query("rl_attention_block_kv")
    n_tiles = -(-s_max // bkv)
    # the FP32 scores go through global memory in the two-launch form only (the library's rule)
    uses_scores = not declared and query("rl_attention_decode_uses_scores", bsz, h, hkv, DECODE_FORMS[form]) == 1
    # the declared form's split step keeps its per-block values in a scratch of the library's size
    split_bytes = query("rl_attention_declared_decode_scratch", bsz, h, hkv, n_tiles) if declared else 0
    shape = (bsz, h, n_tiles * bkv) if uses_scores else (-(-split_bytes // 4),)
    scores = torch.empty(shape, dtype=torch.float32, device=q.device)
    launch(q.device, "rl_attention_decode_form", q, k_cache, v_cache, out, cache_seqlens, scores, bsz, h, hkv, d,
           n_tiles, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
           v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1), float(scale),
           DECODE_FORMS[form], int(d_split))
    return out
