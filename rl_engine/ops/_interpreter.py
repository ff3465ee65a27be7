"""The Triton CPU interpreter with arithmetic defined by this project, not by the host.

Under ``TRITON_INTERPRET=1`` Triton runs a kernel as NumPy code. Three of the interpreter's
operations rest on host libraries whose results change from one machine to the next, so the bits
a kernel produces on a CPU would depend on the machine, not on the kernel
(``docs/cpu-interpreter.md`` has the measurements):

* ``tl.dot`` is ``np.matmul``, i.e. the host BLAS. OpenBLAS's Haswell SGEMM kernel gives a row a
  different result depending on the row's position inside the block, and the kernel in use
  depends on the CPU, ``OPENBLAS_CORETYPE`` and the thread count.
* ``tl.exp`` / ``tl.log`` are NumPy's FP32 ``exp`` / ``log``, whose SIMD implementations (baseline,
  AVX2, AVX-512) give different bits for the same input.
* FP32 -> BF16 conversion truncates (or rounds ties away) instead of rounding to nearest even.

:func:`install` replaces these three with project-defined arithmetic, once per process, and only
in the interpreter (compiled GPU kernels never see it):

``tl.dot(a, b, acc)``
    BF16 operands are decoded exactly to FP32. For every output element the products
    ``fl32(a[i, k] * b[k, j])`` (exact when both operands are BF16 values) are added to the FP32
    accumulator one at a time in increasing ``k``: ``acc = fl32(acc + p_0)``, then ``+ p_1``, ...
    Each element's order depends only on ``K``: not on the row's position in the block, the other
    rows, the BLAS or the thread count (:func:`dot_fixed_order`).
``tl.exp``, ``tl.exp2``, ``tl.log``, ``tl.log2`` on FP32 (and libdevice ``exp``/``exp2``/``log``/``log2``)
    Evaluated in FP64 with basic IEEE operations only (exact range reduction by powers of two, a
    fixed polynomial, ``ldexp``/``frexp``), then rounded once to FP32. IEEE basic operations are
    correctly rounded on every host, so the result is the same everywhere; it is within one FP32
    ulp of the exact value (:func:`exp_fp32`, :func:`log_fp32`).
FP32 -> BF16
    Round to nearest even, as ``cvt.rn.bf16.f32`` does on the GPU (PyTorch's CPU cast).

What stays NumPy's: elementwise ``+ - * /`` and ``sqrt`` (IEEE, correctly rounded everywhere),
``tl.sum`` (``np.sum``: NumPy's pairwise summation, whose order is fixed by NumPy's source for a
given shape), ``tl.max``/``tl.min``. No other transcendental function is used by the package's
kernels; ``tests/ops/test_interpreter.py`` scans the kernels to keep it so.
"""

from __future__ import annotations

import inspect

import numpy as np

from rl_engine.errors import BackendUnavailable

_INSTALLED = False

# fdlibm's split of ln 2: the high part has 32 trailing zero bits, so k * LN2_HI is exact for
# |k| < 2**20, and the low part carries the rest.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LN2 = 0.6931471805599453
_INV_LN2 = 1.4426950408889634
# 1/n! for n = 13 .. 0 (Horner order): |r| <= ln2/2 leaves a truncation error below 2**-60.
_EXP_COEFFS = tuple(1.0 / float(np.prod(np.arange(1, n + 1, dtype=np.float64))) for n in range(13, -1, -1))
# 2/(2n+1) for n = 11 .. 0: log(m) = 2 atanh(s), |s| <= 0.172, truncation below 2**-60.
_LOG_COEFFS = tuple(2.0 / (2 * n + 1) for n in range(11, -1, -1))
_SQRT_HALF = 0.7071067811865476


def _horner(x: np.ndarray, coeffs: tuple[float, ...]) -> np.ndarray:
    out = np.full_like(x, coeffs[0])
    for c in coeffs[1:]:
        out = out * x + c  # two roundings per step: NumPy never fuses them
    return out


def _exp_reduced(x64: np.ndarray, k: np.ndarray, r: np.ndarray) -> np.ndarray:
    """``2**k * exp(r)`` in FP64, rounded once to FP32, with IEEE specials for ``x64``."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        y = np.ldexp(_horner(r, _EXP_COEFFS), k.astype(np.int32)).astype(np.float32)
    y = np.where(np.isnan(x64), np.float32(np.nan), y)
    y = np.where(x64 == np.inf, np.float32(np.inf), y)
    return np.where(x64 == -np.inf, np.float32(0.0), y).astype(np.float32)


def exp_fp32(x: np.ndarray) -> np.ndarray:
    """``exp`` of an FP32 array, the same bits on every host (see module doc)."""
    x64 = np.clip(np.asarray(x, dtype=np.float32).astype(np.float64), -200.0, 200.0)
    x64 = np.where(np.isnan(x64), 0.0, x64)
    k = np.rint(x64 * _INV_LN2)
    r = (x64 - k * _LN2_HI) - k * _LN2_LO
    return _exp_reduced(np.asarray(x, dtype=np.float32).astype(np.float64), k, r)


def exp2_fp32(x: np.ndarray) -> np.ndarray:
    """``2**x`` of an FP32 array, the same bits on every host (see module doc)."""
    x64 = np.clip(np.asarray(x, dtype=np.float32).astype(np.float64), -300.0, 300.0)
    x64 = np.where(np.isnan(x64), 0.0, x64)
    k = np.rint(x64)
    r = (x64 - k) * _LN2  # x64 - k is exact (FP32 input, |k| <= 300)
    return _exp_reduced(np.asarray(x, dtype=np.float32).astype(np.float64), k, r)


def _log_parts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x64, e, log(m))`` with ``x = m * 2**e``, ``m`` in [sqrt(1/2), sqrt(2)), in FP64."""
    x64 = np.asarray(x, dtype=np.float32).astype(np.float64)
    safe = np.where((x64 > 0) & np.isfinite(x64), x64, 1.0)
    m, e = np.frexp(safe)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = np.where(low, e - 1, e).astype(np.float64)
    f = m - 1.0  # exact: m has at most 24 significant bits
    s = f / (2.0 + f)
    return x64, e, s * _horner(s * s, _LOG_COEFFS)


def _log_specials(x64: np.ndarray, y: np.ndarray) -> np.ndarray:
    y = np.where(x64 == 0.0, np.float32(-np.inf), y)
    y = np.where(x64 == np.inf, np.float32(np.inf), y)
    y = np.where((x64 < 0.0) | np.isnan(x64), np.float32(np.nan), y)
    return y.astype(np.float32)


def log_fp32(x: np.ndarray) -> np.ndarray:
    """Natural ``log`` of an FP32 array, the same bits on every host (see module doc)."""
    x64, e, log_m = _log_parts(x)
    return _log_specials(x64, (e * _LN2 + log_m).astype(np.float32))


def log2_fp32(x: np.ndarray) -> np.ndarray:
    """``log2`` of an FP32 array, the same bits on every host (exact at powers of two)."""
    x64, e, log_m = _log_parts(x)
    return _log_specials(x64, (e + log_m * _INV_LN2).astype(np.float32))


def bf16_bits_to_fp32(bits: np.ndarray) -> np.ndarray:
    """Decode raw BF16 bit patterns (uint16/int16) exactly to FP32."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)


LOOP_MIN_OUTPUTS = 1024
"""Output tiles with at least this many elements add the products k by k (one vectorised FP32
multiply and add per k); smaller ones use ``np.add.accumulate`` over all products at once, which
costs less there. Both are the same chain of FP32 operations, so the choice never changes a bit."""


def dot_fixed_order(a: np.ndarray, b: np.ndarray, acc: np.ndarray) -> np.ndarray:
    """``acc + a @ b`` in FP32 with the project's order (see module doc).

    Shapes ``[..., M, K] @ [..., K, N] + [..., M, N]``. Products are rounded to FP32 (exact for
    BF16 values), then added to ``acc`` one at a time in increasing ``k`` with FP32 rounding after
    each add. ``np.add.accumulate`` along ``k`` performs exactly that chain of adds, and so does a
    loop over ``k`` (used for large tiles, :data:`LOOP_MIN_OUTPUTS`).
    """
    a32 = np.asarray(a, dtype=np.float32)
    b32 = np.asarray(b, dtype=np.float32)
    acc32 = np.asarray(acc, dtype=np.float32)
    if a32.shape[-2] * b32.shape[-1] >= LOOP_MIN_OUTPUTS:
        return _dot_k_loop(a32, b32, acc32)
    prods = np.multiply(a32[..., :, :, None], b32[..., None, :, :])  # [..., M, K, N]
    chain = np.concatenate([np.broadcast_to(acc32[..., :, None, :], prods.shape[:-2] + (1,) + prods.shape[-1:]),
                            prods], axis=-2)
    return np.add.accumulate(chain, axis=-2)[..., -1, :]


def _dot_k_loop(a32: np.ndarray, b32: np.ndarray, acc32: np.ndarray) -> np.ndarray:
    """The chain of :func:`dot_fixed_order` as a loop over ``k``: ``out = fl(out + fl(a[:, k] b[k, :]))``."""
    shape = np.broadcast_shapes(acc32.shape, a32.shape[:-1] + b32.shape[-1:])
    out = np.array(np.broadcast_to(acc32, shape), dtype=np.float32)
    prod = np.empty_like(out)
    for k in range(a32.shape[-1]):
        np.multiply(a32[..., :, k, None], b32[..., None, k, :], out=prod)
        np.add(out, prod, out=out)
    return out


def _cache_builtin_members(interp, tl) -> None:
    """Triton's interpreter finds the builtins of ``tl``, ``tl.tensor``, ``tl.math`` ... with
    ``inspect.getmembers`` on every kernel launch and wraps each in a new function (together a
    quarter of a tiny-model chain test's time). The members never change, so they are listed and
    wrapped once here, while nothing is patched; each launch still sets and restores them through
    its patch scope, as Triton does."""
    original = interp._patch_builtin
    patch_attr = interp._patch_attr
    wrapped: dict[int, list] = {}

    class _Collect:
        def __init__(self) -> None:
            self.items: list = []

        def set_attr(self, obj, name, value) -> None:
            self.items.append((name, value))

    def patch_builtin(pkg, builder, scope):
        found = wrapped.get(id(pkg))
        if found is None:
            collect = _Collect()
            for name, member in inspect.getmembers(pkg):
                if tl.core.is_builtin(member):
                    patch_attr(pkg, name, member, builder, collect)
            found = wrapped[id(pkg)] = collect.items
        for name, value in found:
            scope.set_attr(pkg, name, value)

    for pkg in (tl, tl.core, tl.tensor, tl.math, tl.core.tensor_descriptor_base):
        patch_builtin(pkg, None, _NoScope())  # fill the cache now, before any launch has patched a module
    interp._patch_builtin = patch_builtin
    interp._rl_engine_original_patch_builtin = original


class _NoScope:
    """A patch scope that records nothing and changes nothing (fills the member cache; stands for a
    skipped nested patch)."""

    def set_attr(self, obj, name, value) -> None:
        pass

    def restore(self) -> None:
        pass


def _patch_lang_once_per_launch(interp, tl) -> None:
    """Triton's interpreter patches ``tl`` / ``tl.core`` (every builtin of the modules, their tensor
    class and ``tl.math``: some 300 attributes) at each kernel launch and restores them after it, and
    patches them again, without restoring, at every call of a ``@triton.jit`` helper inside the
    kernel (the project's own helpers, and ``tl.sum`` and the other reductions): once per helper call
    per program. For the project's kernels those nested patches were half the time of some tests (a
    norm test 46 -> 22 s on this host). A nested patch sets equivalent wrappers on the same module
    objects the launch (or an earlier helper of the same launch) already patched, so it is skipped
    when the helper sees no module not yet patched in this launch: at most one nested patch per module
    per launch. The launch's own patch and restore are unchanged, and so is what a nested patch leaves
    behind (Triton never restores those); a helper called outside any launch is patched as Triton
    does."""
    launch = interp.GridExecutor.__call__
    # per launch in progress: None until its own patch, then the modules patched in it so far
    patched: list[set | None] = []
    langs_of: dict = {}  # function -> the language modules its globals hold (scanned once per function)

    def patch_lang(fn):
        original = interp._rl_engine_original_patch_lang  # Triton's (looked up per call, so tests can count)
        langs = langs_of.get(fn)
        if langs is None:
            langs = langs_of[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                             if inspect.ismodule(v) and v in (tl, tl.core))
        if not patched:  # outside a launch
            return original(fn)
        if patched[-1] is None:  # the launch's own patch
            patched[-1] = set(langs)
            return original(fn)
        if langs <= patched[-1]:
            return _NoScope()
        patched[-1] |= langs
        return original(fn)

    def launch_once_patched(self, *args, **kwargs):
        patched.append(None)
        try:
            return launch(self, *args, **kwargs)
        finally:
            patched.pop()

    interp._rl_engine_original_patch_lang = interp._patch_lang
    interp._patch_lang = patch_lang
    interp.GridExecutor.__call__ = launch_once_patched


def install() -> None:
    """Install the project's arithmetic into Triton's interpreter (once per process)."""
    global _INSTALLED
    if _INSTALLED:
        return
    import torch
    import triton.language as tl
    from triton.runtime import interpreter as interp

    builder = getattr(interp, "InterpreterBuilder", None)
    original_convert = getattr(interp, "_convert_float", None)
    if builder is None or original_convert is None or not hasattr(builder, "create_dot"):
        raise BackendUnavailable("this Triton's interpreter has no InterpreterBuilder.create_dot / _convert_float;"
                                 " rl_engine cannot define its CPU arithmetic there")
    rtz = getattr(interp._ir.ROUNDING_MODE, "RTZ", None)

    def convert(input, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and (rtz is None or rounding_mode != rtz):
            arr = np.ascontiguousarray(input).view(np.float32).copy()
            out = torch.from_numpy(arr).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return out.reshape(np.shape(input))
        return original_convert(input, input_dtype, output_dtype, rounding_mode)

    original_dot = builder.create_dot

    def operand(t):
        if t.dtype.scalar == tl.bfloat16:
            return bf16_bits_to_fp32(t.data)
        if t.dtype.scalar in (tl.float32, tl.float16):
            return t.data
        return None

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        a_data, b_data = operand(a), operand(b)
        if a_data is None or b_data is None or d.dtype.scalar != tl.float32:
            return original_dot(self, a, b, d, input_precision, max_num_imprecise_acc)
        return interp.TensorHandle(dot_fixed_order(a_data, b_data, d.data), d.dtype.scalar)

    from triton.language.extra import libdevice

    def libdevice_fp32(name, fn):
        def call(arg0, *args, **kwargs):  # the interpreter runs kernels as Python: the stub is replaced
            if args or not isinstance(arg0, tl.tensor) or arg0.dtype != tl.float32:
                raise NotImplementedError(f"libdevice.{name} is defined in rl_engine's interpreter for one FP32 tensor only")
            return tl.tensor(interp.TensorHandle(fn(arg0.handle.data), tl.float32), arg0.type)
        return call

    def unary_fp32(fn, original):
        def create(self, arg):
            if arg.dtype.scalar == tl.float32:
                return interp.TensorHandle(fn(arg.data), arg.dtype.scalar)
            return original(self, arg)
        return create

    interp._convert_float = convert
    builder.create_dot = create_dot
    builder.create_exp = unary_fp32(exp_fp32, builder.create_exp)
    builder.create_exp2 = unary_fp32(exp2_fp32, builder.create_exp2)
    builder.create_log = unary_fp32(log_fp32, builder.create_log)
    builder.create_log2 = unary_fp32(log2_fp32, builder.create_log2)
    # libdevice's Python functions are stubs that only the GPU compiler resolves; in an interpreter
    # process (TRITON_INTERPRET=1, every kernel interpreted) they get the same definitions.
    for name, fn in (("exp", exp_fp32), ("exp2", exp2_fp32), ("log", log_fp32), ("log2", log2_fp32)):
        setattr(libdevice, name, libdevice_fp32(name, fn))
    if hasattr(interp, "_patch_builtin") and hasattr(interp, "_patch_attr"):
        _cache_builtin_members(interp, tl)
    if hasattr(interp, "_patch_lang") and hasattr(interp, "GridExecutor"):
        _patch_lang_once_per_launch(interp, tl)
    _INSTALLED = True
