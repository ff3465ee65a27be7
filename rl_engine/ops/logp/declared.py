"""The switch between the log-sum-exp sequences of ``logp``, ``batch_invariant_logp`` and ``linear_logp``.

``DECLARED_LSE = False`` (the default until contract ws1-c1-v8): each backend runs its own
sequence. The Triton kernel's tile sum is ``tl.sum``, whose order is the compiler's (Triton 3.6, the
H200's, adds each thread's 16 values left to right, 3.9 as a pairwise tree; read from the sm_90 PTX),
its divisions ``x / temperature`` are ``div.full.f32`` (approximate); the CUDA kernels cut each row
into 4096-column chunks with a per-thread online max / sum and ``expf``. The two backends' bits
differ (the gate's cross-backend note: max difference 1.5e-5 at f6919bc).

``DECLARED_LSE = True`` (the default since ws1-c1-v8, which declares the three ops bit-exact across
backends): both backends run the declared sequence of ``docs/declared-arithmetic.md``
("Log-probabilities"): the row in 4096-column tiles in increasing order; ``z = x / temperature``
IEEE-rounded; the tile max; ``m_new = max(m, tile max)``, ``ref = m_new`` (0 where it is ``-inf``);
the tile sum of ``tl.exp(z - ref)`` (``ex2.approx.f32`` of ``z * log2 e``) as a pairwise tree over
column bits 8, 9, 10, 11, then bits 4, 3, 2, 1, 0, then 7, 6, 5; ``s = s * tl.exp(m - ref) + tile
sum``; ``out = (z_t - m) - log(s)`` with libdevice ``logf``. Backward ``dx = (onehot * g - p * g) /
temperature`` with ``p = tl.exp((z - m) - log s)``, IEEE division. It is meant to give the same bits
on both backends (the CPU tests compare the Triton interpreter with the host emulation of the CUDA
sources; the GPU is the judge). Read at every launch, so a test can set it for a call.

The same switch gives ``linear_logp`` one sequence on both backends (its logits are ``lm_head``'s on
both already): the Triton kernels' 128-column tiles per 4096-column chunk with the tile sum in
``fragment_row_sum``'s order and IEEE divisions, the chunks combined in order; CUDA
``rl_logp_tiled_partial`` / ``rl_logp_tiled_finish`` follow it and its dlogits use ``tl.exp``.
"""

DECLARED_LSE = True
