// RMSNorm over the last axis of "rows", for rms_norm ([T, E], one row per token) and qk_norm
// ([T, H, D], one row per (token, head)). A row is addressed through a two-level index
// (outer, inner) with strides, so strided views need no copy.
//
// Forward, per row (contract declared_exceptions.rms_norm_rounding_order):
//   r  = 1 / sqrt(sum(x^2) / n + eps)                     (FP32 statistics)
//   hf:    y = bf16(w * bf16(x * r))                      (Hugging Face Qwen3RMSNorm order)
//   fused: y = bf16((x * r) * w)                          (one rounding)
// The sum is fixed: thread i of the NORM_THREADS threads adds columns i, i + 128, ... in order,
// then a fixed warp butterfly and ((w0 + w1) + (w2 + w3)). It depends only on n.
// r is saved (FP32) for the backward.
//
// Backward (rounding treated as identity, FP32):
//   dn = dy * w;  dx = r * (dn - x * ((sum(dn * x) / n) * (r * r)))
//   dw[c] = sum over rows of dy * (x * r), two stages without atomics: FP32 partial sums over
//   fixed chunks of NORM_DW_ROWS rows in row order, then the chunk partials in chunk order.
#include "common.cuh"

using namespace rl;

namespace {

constexpr int NORM_THREADS = 128;
constexpr int NORM_DW_ROWS = 64;     // rows per partial of the weight gradient
constexpr int NORM_DW_THREADS = 256;  // columns per block of the weight-gradient kernels

__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    __syncthreads();  // red may still be read from a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return (red[0] + red[1]) + (red[2] + red[3]);
}

__device__ __forceinline__ int64_t row_offset(int64_t row, int64_t n_inner, int64_t so, int64_t si) {
    return (row / n_inner) * so + (row % n_inner) * si;
}

template <bool HF>
__global__ void __launch_bounds__(NORM_THREADS)
rms_fwd_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y, float* __restrict__ rstd,
               int64_t n_inner, int64_t n, int64_t sxo, int64_t sxi, int64_t syo, int64_t syi, float eps) {
    __shared__ float red[NORM_THREADS / 32];
    const int64_t row = blockIdx.x;
    const bf16* xr = x + row_offset(row, n_inner, sxo, sxi);
    bf16* yr = y + row_offset(row, n_inner, syo, syi);
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
        const float v = f32(xr[c]);
        ss += v * v;
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
    for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
        const float nv = f32(xr[c]) * r;
        float out;
        if (HF) {
            out = f32(w[c]) * f32(to_bf16(nv));
        } else {
            out = nv * f32(w[c]);
        }
        yr[c] = to_bf16(out);
    }
    if (threadIdx.x == 0) rstd[row] = r;
}

__global__ void __launch_bounds__(NORM_THREADS)
rms_bwd_dx_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ dy,
                  const float* __restrict__ rstd, bf16* __restrict__ dx, int64_t n_inner, int64_t n, int64_t sxo,
                  int64_t sxi, int64_t sdyo, int64_t sdyi, int64_t sdxo, int64_t sdxi) {
    __shared__ float red[NORM_THREADS / 32];
    const int64_t row = blockIdx.x;
    const bf16* xr = x + row_offset(row, n_inner, sxo, sxi);
    const bf16* dyr = dy + row_offset(row, n_inner, sdyo, sdyi);
    bf16* dxr = dx + row_offset(row, n_inner, sdxo, sdxi);
    const float r = rstd[row];
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
        const float dn = f32(dyr[c]) * f32(w[c]);
        dot += dn * f32(xr[c]);
    }
    dot = block_sum(dot, red);
    const float k = (dot / static_cast<float>(n)) * (r * r);
    for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
        const float xv = f32(xr[c]);
        const float dn = f32(dyr[c]) * f32(w[c]);
        dxr[c] = to_bf16(r * (dn - xv * k));
    }
}

// Stage 1: partial[chunk, c] = sum over the rows of the chunk (in order) of dy * (x * r).
__global__ void __launch_bounds__(NORM_DW_THREADS)
rms_bwd_dw_partial_kernel(const bf16* __restrict__ x, const bf16* __restrict__ dy, const float* __restrict__ rstd,
                          float* __restrict__ partial, int64_t rows, int64_t n_inner, int64_t n, int64_t sxo,
                          int64_t sxi, int64_t sdyo, int64_t sdyi) {
    const int64_t chunk = blockIdx.x;
    const int64_t c = static_cast<int64_t>(blockIdx.y) * NORM_DW_THREADS + threadIdx.x;
    if (c >= n) return;
    const int64_t r0 = chunk * NORM_DW_ROWS;
    const int64_t r1 = (r0 + NORM_DW_ROWS) < rows ? (r0 + NORM_DW_ROWS) : rows;
    float acc = 0.0f;
    for (int64_t row = r0; row < r1; ++row) {
        const float xv = f32(x[row_offset(row, n_inner, sxo, sxi) + c]);
        const float g = f32(dy[row_offset(row, n_inner, sdyo, sdyi) + c]);
        acc += g * (xv * rstd[row]);
    }
    partial[chunk * n + c] = acc;
}

// Stage 2: dw[c] = bf16(sum over chunks, in chunk order, of partial[chunk, c]).
__global__ void __launch_bounds__(NORM_DW_THREADS)
rms_bwd_dw_final_kernel(const float* __restrict__ partial, bf16* __restrict__ dw, int64_t chunks, int64_t n) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * NORM_DW_THREADS + threadIdx.x;
    if (c >= n) return;
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) acc += partial[k * n + c];
    dw[c] = to_bf16(acc);
}

}  // namespace

// Number of FP32 partial rows the caller allocates for rl_rms_norm_bwd_dw: ceil(rows / 64).
RL_EXPORT int64_t rl_rms_norm_dw_chunks(int64_t rows) { return cdiv(rows, NORM_DW_ROWS); }

RL_EXPORT int rl_rms_norm_fwd(const void* x, const void* w, void* y, void* rstd, int64_t rows, int64_t n_inner, int64_t n, int64_t sxo, int64_t sxi, int64_t syo, int64_t syi, float eps, int64_t hf_order, void* stream) {
    if (rows == 0 || n == 0) return 0;
    if (rows >= 2147483647LL || n_inner <= 0) return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (hf_order) {
        rms_fwd_kernel<true><<<static_cast<unsigned>(rows), NORM_THREADS, 0, st>>>(
            static_cast<const bf16*>(x), static_cast<const bf16*>(w), static_cast<bf16*>(y), static_cast<float*>(rstd),
            n_inner, n, sxo, sxi, syo, syi, eps);
    } else {
        rms_fwd_kernel<false><<<static_cast<unsigned>(rows), NORM_THREADS, 0, st>>>(
            static_cast<const bf16*>(x), static_cast<const bf16*>(w), static_cast<bf16*>(y), static_cast<float*>(rstd),
            n_inner, n, sxo, sxi, syo, syi, eps);
    }
    return launch_status();
}

RL_EXPORT int rl_rms_norm_bwd_dx(const void* x, const void* w, const void* dy, const void* rstd, void* dx, int64_t rows, int64_t n_inner, int64_t n, int64_t sxo, int64_t sxi, int64_t sdyo, int64_t sdyi, int64_t sdxo, int64_t sdxi, void* stream) {
    if (rows == 0 || n == 0) return 0;
    if (rows >= 2147483647LL || n_inner <= 0) return static_cast<int>(cudaErrorInvalidValue);
    rms_bwd_dx_kernel<<<static_cast<unsigned>(rows), NORM_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(x), static_cast<const bf16*>(w), static_cast<const bf16*>(dy),
        static_cast<const float*>(rstd), static_cast<bf16*>(dx), n_inner, n, sxo, sxi, sdyo, sdyi, sdxo, sdxi);
    return launch_status();
}

// partial: FP32 scratch of rl_rms_norm_dw_chunks(rows) * n elements. dw: [n] BF16 (0 when rows == 0).
RL_EXPORT int rl_rms_norm_bwd_dw(const void* x, const void* dy, const void* rstd, void* partial, void* dw, int64_t rows, int64_t n_inner, int64_t n, int64_t sxo, int64_t sxi, int64_t sdyo, int64_t sdyi, void* stream) {
    if (n == 0) return 0;
    if (n_inner <= 0) return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int64_t chunks = cdiv(rows, NORM_DW_ROWS);
    const int64_t col_blocks = cdiv(n, NORM_DW_THREADS);
    if (chunks >= 2147483647LL || col_blocks > 65535) return static_cast<int>(cudaErrorInvalidValue);
    if (chunks > 0) {
        rms_bwd_dw_partial_kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(col_blocks)),
                                    NORM_DW_THREADS, 0, st>>>(
            static_cast<const bf16*>(x), static_cast<const bf16*>(dy), static_cast<const float*>(rstd),
            static_cast<float*>(partial), rows, n_inner, n, sxo, sxi, sdyo, sdyi);
    }
    rms_bwd_dw_final_kernel<<<static_cast<unsigned>(col_blocks), NORM_DW_THREADS, 0, st>>>(
        static_cast<const float*>(partial), static_cast<bf16*>(dw), chunks, n);
    return launch_status();
}
