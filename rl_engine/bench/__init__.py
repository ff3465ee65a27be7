"""``rl-engine bench``: our kernels against their baselines, side by side in one process.

Modules: :mod:`~rl_engine.bench.counts` (exact FLOP / byte counts), :mod:`~rl_engine.bench.targets`
(the performance targets of docs/decisions.md as data), one module per op family
(:mod:`~rl_engine.bench.gemm`, :mod:`~rl_engine.bench.attention`, :mod:`~rl_engine.bench.norm`,
:mod:`~rl_engine.bench.logprob`, :mod:`~rl_engine.bench.chain`), :mod:`~rl_engine.bench.timing`
(do_bench, memory, peaks), :mod:`~rl_engine.bench.runner` (plan, run, rows) and
:mod:`~rl_engine.bench.report` (bench.json, bench.md, bench.png). Nothing is imported or measured
at package import.
"""
