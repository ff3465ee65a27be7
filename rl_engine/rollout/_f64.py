"""Constants of the sampler's float64 ``log`` / ``exp`` (:mod:`rl_engine.rollout.sampling`), shared with
the one-kernel draw (:mod:`rl_engine.rollout.gumbel_triton`) without either importing the other."""

_MASK32 = 0xFFFFFFFF
_LN2_HI = 6.93147180369123816490e-01  # ln 2 split for Cody-Waite reduction (fdlibm e_exp.c constants):
_LN2_LO = 1.90821492927058770002e-10  # k * _LN2_HI is exact for |k| < 2^11
_INV_LN2 = 1.44269504088896338700e00
_SQRT_HALF = 0.70710678118654752440
_LOG_TERMS = 12  # log(m) = 2 atanh(f), |f| <= 0.1716: f^(2k) / (2k+1) below 2^-53 after 12 terms
_EXP_TERMS = 14  # exp(r), |r| <= ln2 / 2: r^k / k! below 2^-53 after 14 terms
_EXP_UNDERFLOW = -708.0  # exp(x) for x below this counts as 0 (it is below the float64 normal range)
