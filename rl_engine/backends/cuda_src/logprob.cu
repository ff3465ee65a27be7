// Log-probabilities of target tokens from FP32 logits (logp, batch_invariant_logp, and the
// per-chunk pieces of linear_logp). Everything is FP32; logits are never rounded to BF16
// (contract declared_exceptions.logits_for_scoring, pitfalls P4, P5, P11).
//
// The V axis of a row is cut into fixed chunks of LP_CHUNK_V = 4096 entries (a constant, so the
// cut depends on V only, never on T). For each (row, chunk) one block of LP_THREADS threads runs
// an online max / sum-exp of z = logit / temperature: thread i visits entries i, i + 256, ... of
// the chunk in increasing order, then the 256 (max, sum) pairs are combined by a fixed warp
// butterfly and the 8 warp results in warp order. A finish kernel combines the chunk pairs of a
// row in chunk order and writes out = (z_t - m) - log(s), keeping m and log(s) for the backward
// (the FP32 lse in two parts, as the Triton kernels do).
//
// logp runs the partial kernel over all chunks of its [rows, V] logits in one launch;
// linear_logp runs it on one [rows, LP_CHUNK_V] logits chunk at a time (computed by the GEMM and
// never stored in full), with the chunk's global index. The per-(row, chunk) arithmetic is the
// same code, so for equal logits the fused and unfused paths give the same bits.
//
// Backward: dlogits = (onehot * g - p * g) / temperature, p = exp((z - m) - log(s)), FP32.
//
// Rows are addressed through a two-level index (outer, inner) with strides ([T, V] logits use
// n_inner = 1; [B, S, V] logits use n_inner = S), and an optional mask (uint8, 0 = skip): a
// masked row is never read and returns exactly 0 (its dlogits row is exactly 0).
#include "common.cuh"

using namespace rl;

namespace {

constexpr int LP_THREADS = 256;
constexpr int64_t LP_CHUNK_V = 4096;
constexpr int LP_FINISH_THREADS = 256;
constexpr int LP_BWD_COLS = 4096;  // columns per block of the backward kernel

struct RowIndex {
    int64_t n_inner;
    int64_t so;
    int64_t si;
    __device__ __forceinline__ int64_t operator()(int64_t row) const { return (row / n_inner) * so + (row % n_inner) * si; }
};

__device__ __forceinline__ bool row_live(const uint8_t* mask, const RowIndex& mi, int64_t row) {
    return mask == nullptr || mask[mi(row)] != 0;
}

// Partial (max, sum-exp) of z = logits / temperature over one V chunk of one row.
// buf points at the logits of global column col_base (buf row r at buf + bi(r)); the chunk is the
// global column range [chunk * LP_CHUNK_V, min(+LP_CHUNK_V, V)). Writes part_m/part_s at
// [row * n_chunks + chunk] and, in the chunk holding the target, part_t (the target's z).
__global__ void __launch_bounds__(LP_THREADS)
lp_partial_kernel(const float* __restrict__ buf, RowIndex bi, int64_t col_base, int64_t V, int64_t chunk0,
                  int64_t n_chunks, float temperature, const int64_t* __restrict__ targets, RowIndex ti,
                  const uint8_t* __restrict__ mask, RowIndex mi, float* __restrict__ part_m,
                  float* __restrict__ part_s, float* __restrict__ part_t) {
    __shared__ float red_m[LP_THREADS / 32];
    __shared__ float red_s[LP_THREADS / 32];
    const int64_t row = blockIdx.x;
    const int64_t chunk = chunk0 + blockIdx.y;
    if (!row_live(mask, mi, row)) return;
    const int64_t lo = chunk * LP_CHUNK_V;
    const int64_t hi = (lo + LP_CHUNK_V) < V ? (lo + LP_CHUNK_V) : V;
    const float* xr = buf + bi(row);  // global column c at xr[c - col_base]
    float m = -INFINITY;
    float s = 0.0f;
    for (int64_t c = lo + threadIdx.x; c < hi; c += LP_THREADS) {
        const float z = xr[c - col_base] / temperature;
        if (z > m) {
            // New maximum: rescale the running sum (exp(-inf) = 0 on the first entry).
            s = s * expf(m - z) + expf(z - z);  // expf(z - z) is 1, or NaN for z = +inf
            m = z;
        } else {
            const float ref = (m == -INFINITY) ? 0.0f : m;
            s += expf(z - ref);  // z = -inf adds 0; NaN propagates
        }
    }
    // Warp butterfly, then the warps in order.
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off);
        const float s2 = __shfl_xor_sync(0xffffffffu, s, off);
        lse_combine(m, s, m2, s2);
    }
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    if (lane == 0) {
        red_m[warp] = m;
        red_s[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float bm = red_m[0];
        float bs = red_s[0];
        for (int w = 1; w < LP_THREADS / 32; ++w) lse_combine(bm, bs, red_m[w], red_s[w]);
        const int64_t o = row * n_chunks + chunk;
        part_m[o] = bm;
        part_s[o] = bs;
        const int64_t tgt = targets[ti(row)];
        if (tgt >= lo && tgt < hi) part_t[row] = xr[tgt - col_base] / temperature;
    }
}

__global__ void __launch_bounds__(LP_FINISH_THREADS)
lp_finish_kernel(const float* __restrict__ part_m, const float* __restrict__ part_s, const float* __restrict__ part_t,
                 int64_t rows, int64_t n_chunks, const uint8_t* __restrict__ mask, RowIndex mi,
                 float* __restrict__ out, float* __restrict__ rmax, float* __restrict__ rlog) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * LP_FINISH_THREADS + threadIdx.x;
    if (row >= rows) return;
    if (!row_live(mask, mi, row)) {
        out[row] = 0.0f;
        rmax[row] = 0.0f;
        rlog[row] = 0.0f;
        return;
    }
    float m = -INFINITY;
    float s = 0.0f;
    for (int64_t c = 0; c < n_chunks; ++c) lse_combine(m, s, part_m[row * n_chunks + c], part_s[row * n_chunks + c]);
    const float ls = logf(s);
    out[row] = (part_t[row] - m) - ls;
    rmax[row] = m;
    rlog[row] = ls;
}

// dlogits for global columns [col_base, col_base + ncols) of each row, written to dst (may alias
// src: each element is read and then written by the same thread).
__global__ void __launch_bounds__(LP_THREADS)
lp_bwd_kernel(const float* src, RowIndex si, float* dst, RowIndex di, int64_t col_base, int64_t ncols,
              float temperature, const int64_t* __restrict__ targets, RowIndex ti, const uint8_t* __restrict__ mask,
              RowIndex mi, const float* __restrict__ g, const float* __restrict__ rmax, const float* __restrict__ rlog) {
    const int64_t row = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * LP_BWD_COLS;
    float* dr = dst + di(row);
    if (!row_live(mask, mi, row)) {
        for (int i = threadIdx.x; i < LP_BWD_COLS; i += LP_THREADS) {
            const int64_t c = c0 + i;
            if (c >= ncols) break;
            dr[c] = 0.0f;
        }
        return;
    }
    const float* xr = src + si(row);
    const int64_t tgt = targets[ti(row)] - col_base;
    const float gv = g[row];
    const float m = rmax[row];
    const float ls = rlog[row];
    for (int i = threadIdx.x; i < LP_BWD_COLS; i += LP_THREADS) {
        const int64_t c = c0 + i;
        if (c >= ncols) break;
        const float z = xr[c] / temperature;
        const float p = expf((z - m) - ls);
        const float hit = (c == tgt) ? gv : 0.0f;
        dr[c] = (hit - p * gv) / temperature;
    }
}

// FP32 -> a BF16 pair: hi = bf16(x), lo = bf16(x - fp32(hi)) (x - hi is exact in FP32, so hi + lo keeps
// 16 significant bits of x). Rows of `cols` elements, row strides in elements.
constexpr int SPLIT_THREADS = 256;
__global__ void __launch_bounds__(SPLIT_THREADS)
split_hilo_kernel(const float* __restrict__ x, int64_t s_x, bf16* __restrict__ hi, bf16* __restrict__ lo, int64_t s_o,
                  int64_t cols) {
    const int64_t row = blockIdx.x;
    const int64_t c = static_cast<int64_t>(blockIdx.y) * SPLIT_THREADS + threadIdx.x;
    if (c >= cols) return;
    const float v = x[row * s_x + c];
    const bf16 h = to_bf16(v);
    hi[row * s_o + c] = h;
    lo[row * s_o + c] = to_bf16(v - f32(h));
}

}  // namespace

RL_EXPORT int64_t rl_logp_chunk_v(void) { return LP_CHUNK_V; }

// hi / lo split of an FP32 [rows, cols] matrix (row stride s_x) into two BF16 [rows, cols] matrices
// with row stride s_o (the operands of rl_gemm_hilo).
RL_EXPORT int rl_split_hilo(const void* x, int64_t s_x, void* hi, void* lo, int64_t s_o, int64_t rows, int64_t cols, void* stream) {
    if (rows == 0 || cols == 0) return 0;
    const int64_t blocks = cdiv(cols, SPLIT_THREADS);
    if (rows >= 2147483647LL || blocks > 65535) return static_cast<int>(cudaErrorInvalidValue);
    split_hilo_kernel<<<dim3(static_cast<unsigned>(rows), static_cast<unsigned>(blocks)), SPLIT_THREADS, 0,
                        static_cast<cudaStream_t>(stream)>>>(static_cast<const float*>(x), s_x, static_cast<bf16*>(hi),
                                                             static_cast<bf16*>(lo), s_o, cols);
    return launch_status();
}

// Partial (max, sum-exp, target z) of V chunks [chunk0, chunk0 + chunks_here) for every row.
// buf row r starts at buf + (r / n_inner) * s_bo + (r % n_inner) * s_bi and holds global column
// col_base at offset 0. part_m / part_s: [rows, n_chunks] fp32; part_t: [rows] fp32.
RL_EXPORT int rl_logp_partial(const void* buf, int64_t rows, int64_t n_inner, int64_t s_bo, int64_t s_bi, int64_t col_base, int64_t V, int64_t chunk0, int64_t chunks_here, int64_t n_chunks, float temperature, const void* targets, int64_t s_to, int64_t s_ti, const void* mask, int64_t s_mo, int64_t s_mi, void* part_m, void* part_s, void* part_t, void* stream) {
    if (rows == 0 || chunks_here == 0) return 0;
    if (rows >= 2147483647LL || chunks_here > 65535 || n_inner <= 0) return static_cast<int>(cudaErrorInvalidValue);
    dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(chunks_here));
    lp_partial_kernel<<<grid, LP_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(buf), RowIndex{n_inner, s_bo, s_bi}, col_base, V, chunk0, n_chunks, temperature,
        static_cast<const int64_t*>(targets), RowIndex{n_inner, s_to, s_ti}, static_cast<const uint8_t*>(mask),
        RowIndex{n_inner, s_mo, s_mi}, static_cast<float*>(part_m), static_cast<float*>(part_s),
        static_cast<float*>(part_t));
    return launch_status();
}

RL_EXPORT int rl_logp_finish(const void* part_m, const void* part_s, const void* part_t, int64_t rows, int64_t n_inner, int64_t n_chunks, const void* mask, int64_t s_mo, int64_t s_mi, void* out, void* rmax, void* rlog, void* stream) {
    if (rows == 0) return 0;
    if (n_inner <= 0) return static_cast<int>(cudaErrorInvalidValue);
    lp_finish_kernel<<<static_cast<unsigned>(cdiv(rows, LP_FINISH_THREADS)), LP_FINISH_THREADS, 0,
                       static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(part_m), static_cast<const float*>(part_s), static_cast<const float*>(part_t), rows,
        n_chunks, static_cast<const uint8_t*>(mask), RowIndex{n_inner, s_mo, s_mi}, static_cast<float*>(out),
        static_cast<float*>(rmax), static_cast<float*>(rlog));
    return launch_status();
}

// dlogits for global columns [col_base, col_base + ncols): src / dst rows addressed like buf above
// (dst may equal src). g, rmax, rlog: [rows] fp32.
RL_EXPORT int rl_logp_bwd(const void* src, int64_t s_so, int64_t s_si, void* dst, int64_t s_do, int64_t s_di, int64_t rows, int64_t n_inner, int64_t col_base, int64_t ncols, float temperature, const void* targets, int64_t s_to, int64_t s_ti, const void* mask, int64_t s_mo, int64_t s_mi, const void* g, const void* rmax, const void* rlog, void* stream) {
    if (rows == 0 || ncols == 0) return 0;
    const int64_t col_blocks = cdiv(ncols, LP_BWD_COLS);
    if (rows >= 2147483647LL || col_blocks > 65535 || n_inner <= 0) return static_cast<int>(cudaErrorInvalidValue);
    dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(col_blocks));
    lp_bwd_kernel<<<grid, LP_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(src), RowIndex{n_inner, s_so, s_si}, static_cast<float*>(dst),
        RowIndex{n_inner, s_do, s_di}, col_base, ncols, temperature, static_cast<const int64_t*>(targets),
        RowIndex{n_inner, s_to, s_ti}, static_cast<const uint8_t*>(mask), RowIndex{n_inner, s_mo, s_mi},
        static_cast<const float*>(g), static_cast<const float*>(rmax), static_cast<const float*>(rlog));
    return launch_status();
}
