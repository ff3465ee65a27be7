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
// The training fusions (the Triton backend's, the same bits as the separate ops): with a residual
// gradient res (add + RMSNorm) dx = bf16(f32(bf16(dx)) + f32(res)), autograd's sum of the two
// gradients of s; with RoPE (QK-norm + RoPE) every load of dy is the rotation's backward first,
// bf16 of the rotation by -sin as rope_kernel computes it (norm_grad).
#include "common.cuh"

using namespace rl;

namespace {

constexpr int NORM_THREADS = 128;
constexpr int NORM_DW_ROWS = 64;     // rows per partial of the weight gradient
constexpr int NORM_DW_THREADS = 256;  // columns per block of the weight-gradient kernels (128 for rows of <= 128)
constexpr int NORM_DW_UNROLL = 8;     // rows loaded ahead of their adds in the weight gradient's stage 1
static_assert(NORM_DW_ROWS % NORM_DW_UNROLL == 0, "a chunk's rows must be whole unrolled steps");

__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    __syncthreads();  // red may still be read from a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    return (red[0] + red[1]) + (red[2] + red[3]);
}

// r = 1 / sqrt(sum(x^2) / n + eps) and y = the contract's rounding order of x * r * w: the steps of
// rms_fwd_kernel that its decode fusions share (one definition, so the same bits).
__device__ __forceinline__ float rms_rstd(float sumsq, int64_t n, float eps) {
    return 1.0f / sqrtf(sumsq / static_cast<float>(n) + eps);
}
template <bool HF>
__device__ __forceinline__ bf16 rms_out(float x, float r, bf16 w) {
    const float nv = x * r;
    return to_bf16(HF ? f32(w) * f32(to_bf16(nv)) : nv * f32(w));
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
    const float r = rms_rstd(ss, n, eps);
    for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) yr[c] = rms_out<HF>(f32(xr[c]), r, w[c]);
    if (threadIdx.x == 0) rstd[row] = r;
}

// The gradient of the norm's output at column c of a row whose upstream gradient is dyr: dyr[c], or
// with ROPE (the row one head of n = 2 * half columns, cr / sr the token's cos / sin) the rotation's
// backward of dyr as rope_kernel computes it with -sin (each product rounded, then the add), rounded
// to BF16: the gradient the separate norm backward reads.
template <bool ROPE>
__device__ __forceinline__ float norm_grad(const bf16* dyr, int64_t c, int64_t half, const float* cr,
                                           const float* sr) {
    if (!ROPE) return f32(dyr[c]);
    const bool first = c < half;
    const int64_t j = first ? c : c - half;
    const float d = f32(dyr[c]);
    const float p = f32(dyr[first ? c + half : c - half]);
    const float cs = cr[j];
    const float ns = -sr[j];
    return f32(to_bf16(first ? d * cs - p * ns : d * cs + p * ns));
}

// RES: res [rows, n] (row stride srt; rows of a [T, E] input) is added to the BF16 dx; ROPE: dy is
// the gradient of the rotated output (cos / sin [T, n / 2], row strides sct / sst, T = row / n_inner).
template <bool RES, bool ROPE>
__global__ void __launch_bounds__(NORM_THREADS)
rms_bwd_dx_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ dy,
                  const float* __restrict__ rstd, bf16* __restrict__ dx, const bf16* __restrict__ res,
                  const float* __restrict__ cosv, const float* __restrict__ sinv, int64_t n_inner, int64_t n,
                  int64_t sxo, int64_t sxi, int64_t sdyo, int64_t sdyi, int64_t sdxo, int64_t sdxi, int64_t srt,
                  int64_t sct, int64_t sst) {
    __shared__ float red[NORM_THREADS / 32];
    const int64_t row = blockIdx.x;
    const bf16* xr = x + row_offset(row, n_inner, sxo, sxi);
    const bf16* dyr = dy + row_offset(row, n_inner, sdyo, sdyi);
    bf16* dxr = dx + row_offset(row, n_inner, sdxo, sdxi);
    const float* cr = ROPE ? cosv + (row / n_inner) * sct : nullptr;
    const float* sr = ROPE ? sinv + (row / n_inner) * sst : nullptr;
    const int64_t half = n / 2;
    const float r = rstd[row];
    float dot = 0.0f;
    for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
        const float dn = norm_grad<ROPE>(dyr, c, half, cr, sr) * f32(w[c]);
        dot += dn * f32(xr[c]);
    }
    dot = block_sum(dot, red);
    const float k = (dot / static_cast<float>(n)) * (r * r);
    for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
        const float xv = f32(xr[c]);
        const float dn = norm_grad<ROPE>(dyr, c, half, cr, sr) * f32(w[c]);
        float v = r * (dn - xv * k);
        if (RES) v = f32(to_bf16(v)) + f32(res[row * srt + c]);
        dxr[c] = to_bf16(v);
    }
}

// The rows form of the 128-thread row for short rows (n <= 128 * VPT: the heads of qk_norm), a warp
// per row and four rows per block in place of a block per row of one or two columns per thread: lane l
// plays the block's threads l, l + 32, l + 64 and l + 96 (its virtual warps j = 0..3), element (j, m)
// being column 32 j + l + 128 m, so each virtual thread adds the columns of its thread in the same
// order; the four butterflies and ((w0 + w1) + (w2 + w3)) are block_sum's. The same bits as the block
// form, a quarter of its blocks and every thread busy.
constexpr int NORM_ROWS_PER_BLOCK = NORM_THREADS / 32;
constexpr int NORM_ROWS_MAX_N = 2 * NORM_THREADS;

__device__ __forceinline__ int64_t rows_form_col(int j, int m) {
    return 32 * j + (threadIdx.x & 31) + static_cast<int64_t>(NORM_THREADS) * m;
}
__device__ __forceinline__ float rows_form_sum(const float (&p)[NORM_ROWS_PER_BLOCK]) {
    return (warp_sum(p[0]) + warp_sum(p[1])) + (warp_sum(p[2]) + warp_sum(p[3]));
}

template <bool RES, bool ROPE, int VPT>
__global__ void __launch_bounds__(NORM_THREADS)
rms_bwd_dx_rows_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ dy,
                       const float* __restrict__ rstd, bf16* __restrict__ dx, const bf16* __restrict__ res,
                       const float* __restrict__ cosv, const float* __restrict__ sinv, int64_t rows, int64_t n_inner,
                       int64_t n, int64_t sxo, int64_t sxi, int64_t sdyo, int64_t sdyi, int64_t sdxo, int64_t sdxi,
                       int64_t srt, int64_t sct, int64_t sst) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * NORM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (row >= rows) return;  // the whole warp: no block barrier below
    const bf16* xr = x + row_offset(row, n_inner, sxo, sxi);
    const bf16* dyr = dy + row_offset(row, n_inner, sdyo, sdyi);
    bf16* dxr = dx + row_offset(row, n_inner, sdxo, sdxi);
    const float* cr = ROPE ? cosv + (row / n_inner) * sct : nullptr;
    const float* sr = ROPE ? sinv + (row / n_inner) * sst : nullptr;
    const int64_t half = n / 2;
    const float r = rstd[row];
    // every column's dn and x loaded once, all before the first add, and kept for the second pass
    float dn[NORM_ROWS_PER_BLOCK][VPT];
    float xv[NORM_ROWS_PER_BLOCK][VPT];
#pragma unroll
    for (int j = 0; j < NORM_ROWS_PER_BLOCK; ++j)
#pragma unroll
        for (int m = 0; m < VPT; ++m) {
            const int64_t c = rows_form_col(j, m);
            dn[j][m] = c < n ? norm_grad<ROPE>(dyr, c, half, cr, sr) * f32(w[c]) : 0.0f;
            xv[j][m] = c < n ? f32(xr[c]) : 0.0f;
        }
    float p[NORM_ROWS_PER_BLOCK];
#pragma unroll
    for (int j = 0; j < NORM_ROWS_PER_BLOCK; ++j) {
        p[j] = 0.0f;
#pragma unroll
        for (int m = 0; m < VPT; ++m)
            if (rows_form_col(j, m) < n) p[j] += dn[j][m] * xv[j][m];
    }
    const float k = (rows_form_sum(p) / static_cast<float>(n)) * (r * r);
#pragma unroll
    for (int j = 0; j < NORM_ROWS_PER_BLOCK; ++j) {
#pragma unroll
        for (int m = 0; m < VPT; ++m) {
            const int64_t c = rows_form_col(j, m);
            if (c < n) {
                float v = r * (dn[j][m] - xv[j][m] * k);
                if (RES) v = f32(to_bf16(v)) + f32(res[row * srt + c]);
                dxr[c] = to_bf16(v);
            }
        }
    }
}

// Stage 1: partial[chunk, c] = sum over the rows of the chunk (in order) of dy * (x * r) (ROPE: of
// norm_grad's rotated-back dy).
template <bool ROPE>
__global__ void __launch_bounds__(NORM_DW_THREADS)
rms_bwd_dw_partial_kernel(const bf16* __restrict__ x, const bf16* __restrict__ dy, const float* __restrict__ rstd,
                          float* __restrict__ partial, const float* __restrict__ cosv, const float* __restrict__ sinv,
                          int64_t rows, int64_t n_inner, int64_t n, int64_t sxo, int64_t sxi, int64_t sdyo,
                          int64_t sdyi, int64_t sct, int64_t sst) {
    const int64_t chunk = blockIdx.x;
    const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
    if (c >= n) return;
    const int64_t r0 = chunk * NORM_DW_ROWS;
    const int64_t r1 = (r0 + NORM_DW_ROWS) < rows ? (r0 + NORM_DW_ROWS) : rows;
    // row = t * n_inner + h, stepped from the chunk's first row (row_offset's places without a division
    // per row)
    int64_t t = r0 / n_inner;
    int64_t h = r0 - t * n_inner;
    float acc = 0.0f;
    int64_t row = r0;
    // NORM_DW_UNROLL rows at a time: their loads and products first, then the adds in row order (the
    // same adds as the plain loop below; one row per dependent load left this kernel at 9.3 ms of a
    // 4 x 1024-token train step against Triton's unrolled 6.2, H100, evidence/2026-12-06-h100-norm-dw-loads-0baaf9a)
    for (; row + NORM_DW_UNROLL <= r1; row += NORM_DW_UNROLL) {
        float g[NORM_DW_UNROLL];
        float xr[NORM_DW_UNROLL];
#pragma unroll
        for (int u = 0; u < NORM_DW_UNROLL; ++u) {
            const float xv = f32(x[t * sxo + h * sxi + c]);
            g[u] = norm_grad<ROPE>(dy + t * sdyo + h * sdyi, c, n / 2, ROPE ? cosv + t * sct : nullptr,
                                   ROPE ? sinv + t * sst : nullptr);
            xr[u] = xv * rstd[row + u];
            if (++h == n_inner) {
                h = 0;
                ++t;
            }
        }
#pragma unroll
        for (int u = 0; u < NORM_DW_UNROLL; ++u) acc += g[u] * xr[u];
    }
    for (; row < r1; ++row) {
        const float xv = f32(x[t * sxo + h * sxi + c]);
        const float g = norm_grad<ROPE>(dy + t * sdyo + h * sdyi, c, n / 2, ROPE ? cosv + t * sct : nullptr,
                                        ROPE ? sinv + t * sst : nullptr);
        acc += g * (xv * rstd[row]);
        if (++h == n_inner) {
            h = 0;
            ++t;
        }
    }
    partial[chunk * n + c] = acc;
}

// Stage 2: dw[c] = bf16(sum over chunks, in chunk order, of partial[chunk, c]). The partials are loaded
// NORM_DW_LOADS at a time before they are added (in the same order): the q / k norms' head rows have
// 2048 chunks per column at 4096 tokens, and one dependent load per add left this stage 6.2 ms of a
// 4 x 1024-token train step (evidence/2026-12-06-h100-cuda-norm-fusions-af90ca4, prof/). Such a launch
// is one column block whose time is the loads it keeps in flight (columns x NORM_DW_LOADS): 32 loads per
// thread (twice the bytes of 16), and for rows of at most 128 columns blocks of NORM_DW_FINAL_NARROW
// columns (the Triton stage 2's 64-column programs, its fastest in the H200 sweep at 72f74f5), which
// spread those loads over two SMs instead of one. Measured with b0a1c06: 6.2 -> 2.0 ms
// (evidence/2026-12-07-h100-attn-norm-ff1f261).
constexpr int NORM_DW_LOADS = 32;
constexpr int NORM_DW_FINAL_NARROW = 64;
__global__ void __launch_bounds__(NORM_DW_THREADS)
rms_bwd_dw_final_kernel(const float* __restrict__ partial, bf16* __restrict__ dw, int64_t chunks, int64_t n) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float acc = 0.0f;
    int64_t k = 0;
    for (; k + NORM_DW_LOADS <= chunks; k += NORM_DW_LOADS) {
        float v[NORM_DW_LOADS];
#pragma unroll
        for (int u = 0; u < NORM_DW_LOADS; ++u) v[u] = partial[(k + u) * n + c];
#pragma unroll
        for (int u = 0; u < NORM_DW_LOADS; ++u) acc += v[u];
    }
    for (; k < chunks; ++k) acc += partial[k * n + c];
    dw[c] = to_bf16(acc);
}

// Decode-step fusions (rl_engine/chain/fused.py): fewer launches, the separate launches' bits.
//
// add_rms_fwd_kernel: s = bf16(x + delta) (one FP32 addition of two BF16 values, rounded once:
// torch.add's bits), stored, then rms_fwd_kernel's steps on those BF16 values (the same column
// order per thread, butterfly, block combination, division and square root). The row's x, delta
// and weight are staged in shared memory first (16-byte cp.async when VEC_IN, else 2-byte copies),
// so every load of the row is in flight at once from a short loop; thread i then adds and sums
// columns i, i + 128, ... in order, and after the reduction the outputs leave in 16-byte stores
// (VEC_OUT; any thread may write any column then, each column's value is fixed). An earlier form
// kept 32 columns per thread in registers with every column's code unrolled and took 12.7 us per
// launch on the H200 whatever the row count (evidence/2026-12-02-h200-decode-80982b6).
constexpr int64_t ADD_RMS_MAX_N = 8192;

// With early_w (PDL mode 2, common.cuh) the weight's copies are issued before pdl_wait and overlap
// the end of the kernel before; the row is copied after it.
__device__ __forceinline__ void add_rms_row(const bf16* __restrict__ xr, const bf16* __restrict__ dr,
                                            const bf16* __restrict__ w, bf16* xs, bf16* ds, bf16* ws, int64_t n,
                                            bool vec, bool early_w) {
    if (vec) {
        if (early_w)
            for (int64_t e = threadIdx.x; e < n / 8; e += NORM_THREADS) cp_async16(ws + 8 * e, w + 8 * e, 16);
        pdl_wait();
        pdl_launch_dependents();
        if (!early_w)
            for (int64_t e = threadIdx.x; e < n / 8; e += NORM_THREADS) cp_async16(ws + 8 * e, w + 8 * e, 16);
        for (int64_t e = threadIdx.x; e < n / 8; e += NORM_THREADS) {
            cp_async16(xs + 8 * e, xr + 8 * e, 16);
            cp_async16(ds + 8 * e, dr + 8 * e, 16);
        }
        cp_async_commit();
        cp_async_wait<0>();
    } else {
        pdl_wait();  // the 2-byte path has no copy to leave in flight
        pdl_launch_dependents();
        for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
            xs[c] = xr[c];
            ds[c] = dr[c];
            ws[c] = w[c];
        }
    }
    __syncthreads();
}

template <bool HF>
__global__ void __launch_bounds__(NORM_THREADS)
add_rms_fwd_kernel(const bf16* __restrict__ x, const bf16* __restrict__ delta, const bf16* __restrict__ w,
                   bf16* __restrict__ s_out, bf16* __restrict__ y, float* __restrict__ rstd, int64_t n, int64_t sx,
                   int64_t sd, int64_t ss, int64_t sy, float eps, int vec_in, int vec_out, int early_w) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ float red[NORM_THREADS / 32];
    bf16* xs = reinterpret_cast<bf16*>(smem_raw);  // [n]: x, then s
    bf16* ds = xs + n;                             // [n]: delta
    bf16* ws = ds + n;                             // [n]: the weight
    const int64_t row = blockIdx.x;
    add_rms_row(x + row * sx, delta + row * sd, w, xs, ds, ws, n, vec_in != 0, early_w != 0);
    float sq = 0.0f;
    for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
        const float v = f32(to_bf16(f32(xs[c]) + f32(ds[c])));
        xs[c] = to_bf16(v);  // exact: v is a BF16 value
        sq += v * v;
    }
    sq = block_sum(sq, red);  // its barriers also publish every thread's s in xs
    const float r = rms_rstd(sq, n, eps);
    if (rstd != nullptr && threadIdx.x == 0) rstd[row] = r;  // training: kept for the backward
    bf16* so = s_out + row * ss;
    bf16* yo = y + row * sy;
    if (vec_out) {
        for (int64_t e = threadIdx.x; e < n / 8; e += NORM_THREADS) {
            const uint4 sv = *reinterpret_cast<const uint4*>(xs + 8 * e);
            const uint4 wv = *reinterpret_cast<const uint4*>(ws + 8 * e);
            const bf16* s8 = reinterpret_cast<const bf16*>(&sv);
            const bf16* w8 = reinterpret_cast<const bf16*>(&wv);
            uint4 yv;
            bf16* y8 = reinterpret_cast<bf16*>(&yv);
#pragma unroll
            for (int i = 0; i < 8; ++i) y8[i] = rms_out<HF>(f32(s8[i]), r, w8[i]);
            *reinterpret_cast<uint4*>(so + 8 * e) = sv;
            *reinterpret_cast<uint4*>(yo + 8 * e) = yv;
        }
    } else {
        for (int64_t c = threadIdx.x; c < n; c += NORM_THREADS) {
            so[c] = xs[c];
            yo[c] = rms_out<HF>(f32(xs[c]), r, ws[c]);
        }
    }
}

// rope_kernel's rotation of one column of a normed head (rounded once): the first half's
// y1 = x1 c - x2 s, the second half's y2 = x2 c + x1 s, x1 / x2 the columns i and i + d / 2.
__device__ __forceinline__ bf16 rope_out(bool first_half, float x1, float x2, float c, float s) {
    return to_bf16(first_half ? x1 * c - x2 * s : x2 * c + x1 * s);
}
// Column c of a head whose normed values (FP32 of the BF16 outputs) are ys[0 .. d), rotated with the cos /
// sin row cr / sr (d = 2 half).
__device__ __forceinline__ bf16 rope_col(const float* ys, const float* cr, const float* sr, int64_t c, int64_t half) {
    const int64_t i = c < half ? c : c - half;
    return rope_out(c < half, ys[i], ys[i + half], cr[i], sr[i]);
}

// qk_norm_rope_kernel: block (t, r) for r < n_q a query head, then n_kv key heads (normed as
// rms_fwd_kernel does a row of D, rotated as rope_kernel does: y1 = x1 c - x2 s, y2 = x2 c + x1 s on
// the norm's BF16 output, rounded once; with a cache the rotated key is also stored there), then
// n_kv value heads (copied to the cache only). D <= NORM_THREADS * VPT.
constexpr int QNR_MAX_D = 2 * NORM_THREADS;

template <bool HF, int VPT>
__global__ void __launch_bounds__(NORM_THREADS)
qk_norm_rope_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                    const bf16* __restrict__ qw, const bf16* __restrict__ kw, const float* __restrict__ cosv,
                    const float* __restrict__ sinv, bf16* __restrict__ qo, bf16* __restrict__ ko, bf16* kc, bf16* vc,
                    const int64_t* __restrict__ rows, const int64_t* __restrict__ pos, int64_t n_q, int64_t n_kv,
                    int64_t d, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh,
                    int64_t s_ct, int64_t s_st, int64_t s_qot, int64_t s_qoh, int64_t s_kot, int64_t s_koh,
                    int64_t s_cb, int64_t s_cs, int64_t s_ch, int64_t s_vcb, int64_t s_vcs, int64_t s_vch, float eps,
                    int cache) {
    __shared__ float red[NORM_THREADS / 32];
    __shared__ float ys[QNR_MAX_D];
    const int64_t t = blockIdx.x;
    const int64_t r = blockIdx.y;
    pdl_wait();  // launched through launch_pdl: q, k, v come from the kernel before
    pdl_launch_dependents();
    if (r >= n_q + n_kv) {  // a value head: the cache stores v's bits
        if (!cache) return;
        const int64_t h = r - n_q - n_kv;
        const bf16* src = v + t * s_vt + h * s_vh;
        bf16* dst = vc + rows[t] * s_vcb + pos[t] * s_vcs + h * s_vch;
        for (int64_t c = threadIdx.x; c < d; c += NORM_THREADS) put_bits(dst + c, bits(src + c));
        return;
    }
    const bool is_q = r < n_q;
    const int64_t h = is_q ? r : r - n_q;
    const bf16* xr = is_q ? q + t * s_qt + h * s_qh : k + t * s_kt + h * s_kh;
    const bf16* w = is_q ? qw : kw;
    float xv[VPT];
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(NORM_THREADS) * j;
        xv[j] = c < d ? f32(xr[c]) : 0.0f;
        if (c < d) sq += xv[j] * xv[j];
    }
    sq = block_sum(sq, red);
    const float rs = rms_rstd(sq, d, eps);
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(NORM_THREADS) * j;
        if (c < d) ys[c] = f32(rms_out<HF>(xv[j], rs, w[c]));
    }
    __syncthreads();
    const int64_t half = d / 2;
    bf16* out = is_q ? qo + t * s_qot + h * s_qoh : ko + t * s_kot + h * s_koh;
    bf16* kcache = (!is_q && cache) ? kc + rows[t] * s_cb + pos[t] * s_cs + h * s_ch : nullptr;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
        const int64_t c = threadIdx.x + static_cast<int64_t>(NORM_THREADS) * j;
        if (c < d) {
            const bf16 o = rope_col(ys, cosv + t * s_ct, sinv + t * s_st, c, half);
            out[c] = o;
            if (kcache) kcache[c] = o;
        }
    }
}

// Training's QK-norm + RoPE of [T, H, d] rows (row t * H + h) in the rows form: rms_fwd_kernel's norm
// (its column order per thread and block_sum, by rows_form_sum) rounded to BF16, then rope_kernel's
// rotation of that output (y1 = x1 c - x2 s, y2 = x2 c + x1 s, rounded once), and the norm's r kept.
// HV > 0 (d = 64 HV: the heads of 64, 128 and 256): column c = 32 g + l of lane l (g = j + 4 m, rows_form_col)
// has its rotation partner c +- d / 2 in group g +- HV of the same lane, so the rotation reads the normed
// values from registers, and each lane loads only the HV cos / sin pairs and the 2 HV norm weights of its
// columns, issued with x before the sum (the weights had waited behind rstd's division / sqrt calls).
// HV = 0 (any other even d): the normed row goes through shared memory. The same values,
// expressions and roundings either way (the same bits); 2026-12-07's H100 profile of 8 x 1024 teacher
// forcing had the shared-memory form at 6.3 ms against Triton's 2.6 ms for the same rows.
template <bool HF, int VPT, int HV>
__global__ void __launch_bounds__(NORM_THREADS)
norm_rope_rows_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, const float* __restrict__ cosv,
                      const float* __restrict__ sinv, bf16* __restrict__ y, float* __restrict__ rstd, int64_t rows,
                      int64_t n_inner, int64_t d, int64_t sxo, int64_t sxi, int64_t sct, int64_t sst, int64_t syo,
                      int64_t syi, float eps) {
    static_assert(HV == 0 || 2 * HV <= NORM_ROWS_PER_BLOCK * VPT, "the row's groups fit the lane's columns");
    __shared__ float ys[HV == 0 ? NORM_ROWS_PER_BLOCK : 1][HV == 0 ? NORM_ROWS_MAX_N : 1];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t row = static_cast<int64_t>(blockIdx.x) * NORM_ROWS_PER_BLOCK + warp;
    if (row >= rows) return;  // the whole warp: it only waits for itself (__syncwarp)
    const int64_t t = row / n_inner;
    const bf16* xr = x + row_offset(row, n_inner, sxo, sxi);
    float cs[HV > 0 ? HV : 1], sn[HV > 0 ? HV : 1];
    bf16 wv[HV > 0 ? 2 * HV : 1];
#pragma unroll
    for (int g = 0; g < HV; ++g) {  // (HV > 0) cos / sin of column 32 g + l and of its partner
        cs[g] = cosv[t * sct + 32 * g + lane];
        sn[g] = sinv[t * sst + 32 * g + lane];
    }
#pragma unroll
    for (int g = 0; g < 2 * HV; ++g) wv[g] = w[32 * g + lane];  // the norm weight, issued with x (not after rstd)
    float xv[NORM_ROWS_PER_BLOCK][VPT];
    float p[NORM_ROWS_PER_BLOCK];
#pragma unroll
    for (int j = 0; j < NORM_ROWS_PER_BLOCK; ++j) {
        p[j] = 0.0f;
#pragma unroll
        for (int m = 0; m < VPT; ++m) {
            const int64_t c = rows_form_col(j, m);
            xv[j][m] = c < d ? f32(xr[c]) : 0.0f;
            if (c < d) p[j] += xv[j][m] * xv[j][m];
        }
    }
    const float rs = rms_rstd(rows_form_sum(p), d, eps);
    if (lane == 0) rstd[row] = rs;
    bf16* out = y + row_offset(row, n_inner, syo, syi);
    if constexpr (HV > 0) {
        // the normed BF16 values of groups g = j + 4 m < 2 HV (d = 64 HV: no column of them past d)
        float yv[NORM_ROWS_PER_BLOCK * VPT];
#pragma unroll
        for (int g = 0; g < 2 * HV; ++g) yv[g] = f32(rms_out<HF>(xv[g % NORM_ROWS_PER_BLOCK][g / NORM_ROWS_PER_BLOCK], rs, wv[g]));
#pragma unroll
        for (int g = 0; g < 2 * HV; ++g) {
            const bool first = g < HV;  // c < d / 2
            const int i = first ? g : g - HV;
            const float x1 = yv[i];
            const float x2 = yv[i + HV];
            out[32 * g + lane] = rope_out(first, x1, x2, cs[i], sn[i]);
        }
    } else {
        float* yr = ys[warp];
#pragma unroll
        for (int j = 0; j < NORM_ROWS_PER_BLOCK; ++j)
#pragma unroll
            for (int m = 0; m < VPT; ++m) {
                const int64_t c = rows_form_col(j, m);
                if (c < d) yr[c] = f32(rms_out<HF>(xv[j][m], rs, w[c]));
            }
        __syncwarp();
        const int64_t half = d / 2;
#pragma unroll
        for (int j = 0; j < NORM_ROWS_PER_BLOCK; ++j)
#pragma unroll
            for (int m = 0; m < VPT; ++m) {
                const int64_t c = rows_form_col(j, m);
                if (c < d) out[c] = rope_col(yr, cosv + t * sct, sinv + t * sst, c, half);
            }
    }
}

}  // namespace

// Whether rl_norm_rope_fwd rotates in registers for d = 64, 128 and 256 (norm_rope_rows_kernel's HV > 0; 1, the
// default) or through shared memory as before 2026-12-07 (0). Returns the previous setting, or -1 (and changes
// nothing) for another value. The bits do not depend on it (tested).
int g_norm_rope_in_lane = 1;
RL_EXPORT int64_t rl_norm_rope_in_lane(int64_t on) {
    if (on != 0 && on != 1) return -1;
    const int64_t old = g_norm_rope_in_lane;
    g_norm_rope_in_lane = static_cast<int>(on);
    return old;
}

// Training's QK-norm + RoPE: y = rope(qk_norm(x)) of [tokens, heads, d] rows and rstd [tokens * heads] FP32;
// d even, d <= 256; cos / sin [tokens, d / 2] (row strides sct / sst).
RL_EXPORT int rl_norm_rope_fwd(const void* x, const void* w, const void* cosv, const void* sinv, void* y, void* rstd, int64_t tokens, int64_t heads, int64_t d, int64_t sxo, int64_t sxi, int64_t sct, int64_t sst, int64_t syo, int64_t syi, float eps, int64_t hf_order, void* stream) {
    const int64_t rows = tokens * heads;
    if (rows == 0 || d == 0) return 0;
    if (heads <= 0 || (d & 1) || d > NORM_ROWS_MAX_N || cdiv(rows, NORM_ROWS_PER_BLOCK) >= 2147483647LL)
        return static_cast<int>(cudaErrorInvalidValue);
    // the in-lane rotation for d = 64, 128, 256 where g_norm_rope_in_lane (rl_norm_rope_in_lane) allows it
    const int hv = (g_norm_rope_in_lane && (d == 64 || d == 128 || d == 256)) ? static_cast<int>(d / 64) : 0;
    const auto kernel = hf_order ? (hv == 1   ? norm_rope_rows_kernel<true, 1, 1>
                                    : hv == 2 ? norm_rope_rows_kernel<true, 1, 2>
                                    : hv == 4 ? norm_rope_rows_kernel<true, 2, 4>
                                    : d <= NORM_THREADS ? norm_rope_rows_kernel<true, 1, 0> : norm_rope_rows_kernel<true, 2, 0>)
                                 : (hv == 1   ? norm_rope_rows_kernel<false, 1, 1>
                                    : hv == 2 ? norm_rope_rows_kernel<false, 1, 2>
                                    : hv == 4 ? norm_rope_rows_kernel<false, 2, 4>
                                    : d <= NORM_THREADS ? norm_rope_rows_kernel<false, 1, 0> : norm_rope_rows_kernel<false, 2, 0>);
    kernel<<<static_cast<unsigned>(cdiv(rows, NORM_ROWS_PER_BLOCK)), NORM_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(x), static_cast<const bf16*>(w), static_cast<const float*>(cosv),
        static_cast<const float*>(sinv), static_cast<bf16*>(y), static_cast<float*>(rstd), rows, heads, d, sxo, sxi,
        sct, sst, syo, syi, eps);
    return launch_status();
}

// Decode fusion: s = x + delta and y = rms_norm(s) over [T, n] rows (unit stride on n); n <= 8192. Training
// passes rstd ([T] FP32, the norm's r per row, for the backward); the decode step nullptr.
RL_EXPORT int rl_add_rms_norm_fwd(const void* x, const void* delta, const void* w, void* s, void* y, void* rstd, int64_t rows, int64_t n, int64_t sx, int64_t sd, int64_t ss, int64_t sy, float eps, int64_t hf_order, void* stream) {
    if (rows == 0 || n == 0) return 0;
    if (rows >= 2147483647LL || n > ADD_RMS_MAX_N) return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const auto a16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
    const int vec_in = a16(x) && a16(delta) && a16(w) && n % 8 == 0 && sx % 8 == 0 && sd % 8 == 0;
    const int vec_out = a16(s) && a16(y) && n % 8 == 0 && ss % 8 == 0 && sy % 8 == 0;
    const size_t smem = static_cast<size_t>(3 * n) * sizeof(bf16);
    const auto kernel = hf_order ? add_rms_fwd_kernel<true> : add_rms_fwd_kernel<false>;
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
    return launch_pdl(kernel, dim3(static_cast<unsigned>(rows)), dim3(NORM_THREADS), smem, st, static_cast<const bf16*>(x),
                      static_cast<const bf16*>(delta), static_cast<const bf16*>(w), static_cast<bf16*>(s),
                      static_cast<bf16*>(y), static_cast<float*>(rstd), n, sx, sd, ss, sy, eps, vec_in, vec_out,
                      static_cast<int>(pdl_early_weights()));
}

// Decode fusion: qk_norm of q [T, n_q, d] and k [T, n_kv, d], RoPE of both, and with cache = 1 the
// K/V cache write (k_cache[rows[t], pos[t], h] = rotated k, v_cache[...] = v); d even, d <= 256.
RL_EXPORT int rl_qk_norm_rope_fwd(const void* q, const void* k, const void* v, const void* qw, const void* kw, const void* cosv, const void* sinv, void* qo, void* ko, void* kc, void* vc, const void* rows, const void* pos, int64_t tokens, int64_t n_q, int64_t n_kv, int64_t d, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_ct, int64_t s_st, int64_t s_qot, int64_t s_qoh, int64_t s_kot, int64_t s_koh, int64_t s_cb, int64_t s_cs, int64_t s_ch, int64_t s_vcb, int64_t s_vcs, int64_t s_vch, float eps, int64_t hf_order, int64_t cache, void* stream) {
    if (tokens == 0 || n_q + n_kv == 0 || d == 0) return 0;
    if (tokens >= 2147483647LL || n_q + 2 * n_kv > 65535 || (d & 1) || d > QNR_MAX_D)
        return static_cast<int>(cudaErrorInvalidValue);
    dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(n_q + 2 * n_kv));
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    int rc = 0;
#define RL_QNR(HF, V)                                                                                              \
    rc = launch_pdl(qk_norm_rope_kernel<HF, V>, grid, dim3(NORM_THREADS), 0, st,                                    \
        static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),                     \
        static_cast<const bf16*>(qw), static_cast<const bf16*>(kw), static_cast<const float*>(cosv),               \
        static_cast<const float*>(sinv), static_cast<bf16*>(qo), static_cast<bf16*>(ko), static_cast<bf16*>(kc),   \
        static_cast<bf16*>(vc), static_cast<const int64_t*>(rows), static_cast<const int64_t*>(pos), n_q, n_kv, d, \
        s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ct, s_st, s_qot, s_qoh, s_kot, s_koh, s_cb, s_cs, s_ch, s_vcb, s_vcs,  \
        s_vch, eps, cache ? 1 : 0)
    if (d <= NORM_THREADS) {
        if (hf_order) RL_QNR(true, 1); else RL_QNR(false, 1);
    } else {
        if (hf_order) RL_QNR(true, 2); else RL_QNR(false, 2);
    }
#undef RL_QNR
    return rc;
}

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

// res: nullptr, or the residual gradient [rows, n] (row stride srt) added to the BF16 dx (add + RMSNorm);
// cosv / sinv: nullptr, or the RoPE tables [rows / n_inner, n / 2] (row strides sct / sst) whose rotation
// dy's loads take back first (QK-norm + RoPE; n even).
RL_EXPORT int rl_rms_norm_bwd_dx(const void* x, const void* w, const void* dy, const void* rstd, void* dx, const void* res, const void* cosv, const void* sinv, int64_t rows, int64_t n_inner, int64_t n, int64_t sxo, int64_t sxi, int64_t sdyo, int64_t sdyi, int64_t sdxo, int64_t sdxi, int64_t srt, int64_t sct, int64_t sst, void* stream) {
    if (rows == 0 || n == 0) return 0;
    const bool rope = cosv != nullptr;
    if (rows >= 2147483647LL || n_inner <= 0 || rope != (sinv != nullptr) || (rope && (n & 1)))
        return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const auto* xp = static_cast<const bf16*>(x);
    const auto* wp = static_cast<const bf16*>(w);
    const auto* dyp = static_cast<const bf16*>(dy);
    const auto* rp = static_cast<const float*>(rstd);
    auto* dxp = static_cast<bf16*>(dx);
    const auto* resp = static_cast<const bf16*>(res);
    const auto* cp = static_cast<const float*>(cosv);
    const auto* sp = static_cast<const float*>(sinv);
    if (n <= NORM_ROWS_MAX_N) {  // short rows (the heads of qk_norm): a warp per row, the same bits
#define RL_DX_ROWS(R, P, V)                                                                                      \
    rms_bwd_dx_rows_kernel<R, P, V><<<static_cast<unsigned>(cdiv(rows, NORM_ROWS_PER_BLOCK)), NORM_THREADS, 0, st>>>( \
        xp, wp, dyp, rp, dxp, resp, cp, sp, rows, n_inner, n, sxo, sxi, sdyo, sdyi, sdxo, sdxi, srt, sct, sst)
        const bool two = n > NORM_THREADS;
        if (res) {
            if (rope) { if (two) RL_DX_ROWS(true, true, 2); else RL_DX_ROWS(true, true, 1); }
            else { if (two) RL_DX_ROWS(true, false, 2); else RL_DX_ROWS(true, false, 1); }
        } else {
            if (rope) { if (two) RL_DX_ROWS(false, true, 2); else RL_DX_ROWS(false, true, 1); }
            else { if (two) RL_DX_ROWS(false, false, 2); else RL_DX_ROWS(false, false, 1); }
        }
#undef RL_DX_ROWS
        return launch_status();
    }
    // (a form that loaded each thread's 32 columns of dn and x into registers before the first add, same
    // bits, took 14.7 ms of a 4 x 1024 train step on an H100 where this one took 5.4:
    // evidence/2026-12-07-h100-attn-norm-ff1f261/)
    const auto kernel = res ? (rope ? rms_bwd_dx_kernel<true, true> : rms_bwd_dx_kernel<true, false>)
                            : (rope ? rms_bwd_dx_kernel<false, true> : rms_bwd_dx_kernel<false, false>);
    kernel<<<static_cast<unsigned>(rows), NORM_THREADS, 0, st>>>(xp, wp, dyp, rp, dxp, resp, cp, sp, n_inner, n, sxo,
                                                                  sxi, sdyo, sdyi, sdxo, sdxi, srt, sct, sst);
    return launch_status();
}

// partial: FP32 scratch of rl_rms_norm_dw_chunks(rows) * n elements. dw: [n] BF16 (0 when rows == 0).
// cosv / sinv: as rl_rms_norm_bwd_dx.
RL_EXPORT int rl_rms_norm_bwd_dw(const void* x, const void* dy, const void* rstd, void* partial, void* dw, const void* cosv, const void* sinv, int64_t rows, int64_t n_inner, int64_t n, int64_t sxo, int64_t sxi, int64_t sdyo, int64_t sdyi, int64_t sct, int64_t sst, void* stream) {
    if (n == 0) return 0;
    const bool rope = cosv != nullptr;
    if (n_inner <= 0 || rope != (sinv != nullptr) || (rope && (n & 1))) return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int64_t chunks = cdiv(rows, NORM_DW_ROWS);
    // columns per block: half of NORM_DW_THREADS for head rows of at most that many columns (the q / k
    // norms' 128: no idle half block); a column's sums do not depend on its block
    const int threads = n <= NORM_DW_THREADS / 2 ? NORM_DW_THREADS / 2 : NORM_DW_THREADS;
    const int64_t col_blocks = cdiv(n, static_cast<int64_t>(threads));
    if (chunks >= 2147483647LL || col_blocks > 65535) return static_cast<int>(cudaErrorInvalidValue);
    if (chunks > 0) {
        const auto kernel = rope ? rms_bwd_dw_partial_kernel<true> : rms_bwd_dw_partial_kernel<false>;
        kernel<<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(col_blocks)), threads, 0, st>>>(
            static_cast<const bf16*>(x), static_cast<const bf16*>(dy), static_cast<const float*>(rstd),
            static_cast<float*>(partial), static_cast<const float*>(cosv), static_cast<const float*>(sinv), rows,
            n_inner, n, sxo, sxi, sdyo, sdyi, sct, sst);
    }
    // stage 2: a column's sum does not depend on its block either
    const int final_threads = n <= NORM_DW_THREADS / 2 ? NORM_DW_FINAL_NARROW : NORM_DW_THREADS;
    rms_bwd_dw_final_kernel<<<static_cast<unsigned>(cdiv(n, static_cast<int64_t>(final_threads))), final_threads, 0, st>>>(
        static_cast<const float*>(partial), static_cast<bf16*>(dw), chunks, n);
    return launch_status();
}
