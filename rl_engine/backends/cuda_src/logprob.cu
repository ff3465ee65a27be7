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
// TL_EXP: p from tl_exp (the declared logp / batch_invariant_logp sequence) instead of expf.
template <bool TL_EXP>
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
        const float p = TL_EXP ? tl_exp((z - m) - ls) : expf((z - m) - ls);
        const float hit = (c == tgt) ? gv : 0.0f;
        dr[c] = (hit - p * gv) / temperature;
    }
}

// ---------------------------------------------------------------------------------------------
// The declared log-sum-exp of logp / batch_invariant_logp (docs/declared-arithmetic.md, "Log-
// probabilities"): the Triton kernel's sequence (rl_engine/ops/logp/triton.py, DECLARED_LSE), so the
// two backends give the same bits. One block of LPD_THREADS = 256 threads per row walks the row in
// tiles of LPD_TILE = 4096 columns in increasing order; thread i holds tile columns 256 r + i,
// r = 0 .. 15. Per tile: z = logit / temperature (IEEE division); the tile's max (an order-free
// max); m_new = max(m, tile max), ref = m_new or 0 where m_new = -inf; the tile sum of
// tl_exp(z - ref) in the declared order (below); s = s * tl_exp(m - ref) + tile sum; m = m_new.
// Then out = (z_t - m) - logf(s), keeping m and logf(s) for the backward.
// The tile sum: each thread's 16 values as a pairwise tree over r (bits 8, 9, 10, 11 of the column
// in the tile), the warp butterfly with offsets 16, 8, 4, 2, 1 (bits 4 .. 0), then the 8 warp sums
// as a butterfly with offsets 4, 2, 1 (bits 7, 6, 5). Each step is one addition of two defined
// operands, so the order is the program's.
constexpr int LPD_THREADS = 256;
constexpr int LPD_PER_THREAD = 16;
constexpr int64_t LPD_TILE = static_cast<int64_t>(LPD_THREADS) * LPD_PER_THREAD;

// The block's max of v (every thread gets it); red holds LPD_THREADS / 32 floats.
__device__ __forceinline__ float lpd_block_max(float v, float* red) {
    v = warp_max(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float b = red[0];
#pragma unroll
    for (int w = 1; w < LPD_THREADS / 32; ++w) b = fmaxf(b, red[w]);
    __syncthreads();  // red is reused by the next reduction
    return b;
}

// The block's sum of v in the declared order (lanes 16, 8, 4, 2, 1, then warps 4, 2, 1).
__device__ __forceinline__ float lpd_block_sum(float v, float* red) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float w4[4], w2[2];
#pragma unroll
    for (int k = 0; k < 4; ++k) w4[k] = red[k] + red[k + 4];
#pragma unroll
    for (int k = 0; k < 2; ++k) w2[k] = w4[k] + w4[k + 2];
    __syncthreads();
    return w2[0] + w2[1];
}

__global__ void __launch_bounds__(LPD_THREADS)
lpd_fwd_kernel(const float* __restrict__ buf, RowIndex bi, int64_t V, float temperature,
               const int64_t* __restrict__ targets, RowIndex ti, const uint8_t* __restrict__ mask, RowIndex mi,
               float* __restrict__ out, float* __restrict__ rmax, float* __restrict__ rlog) {
    __shared__ float red[LPD_THREADS / 32];
    const int64_t row = blockIdx.x;
    if (!row_live(mask, mi, row)) {
        if (threadIdx.x == 0) {
            out[row] = 0.0f;
            rmax[row] = 0.0f;
            rlog[row] = 0.0f;
        }
        return;
    }
    const float* xr = buf + bi(row);
    float m = -INFINITY;
    float s = 0.0f;
    float x[LPD_PER_THREAD];
#pragma unroll
    for (int r = 0; r < LPD_PER_THREAD; ++r) {
        const int64_t c = static_cast<int64_t>(r) * LPD_THREADS + threadIdx.x;
        x[r] = c < V ? xr[c] : -INFINITY;
    }
    for (int64_t lo = 0; lo < V; lo += LPD_TILE) {
        float z[LPD_PER_THREAD];
#pragma unroll
        for (int r = 0; r < LPD_PER_THREAD; ++r) z[r] = x[r] / temperature;
        // The next tile's loads before this tile's reductions (decode reads one row).
#pragma unroll
        for (int r = 0; r < LPD_PER_THREAD; ++r) {
            const int64_t c = lo + LPD_TILE + static_cast<int64_t>(r) * LPD_THREADS + threadIdx.x;
            x[r] = c < V ? xr[c] : -INFINITY;
        }
        float tm = z[0];
#pragma unroll
        for (int r = 1; r < LPD_PER_THREAD; ++r) tm = fmaxf(tm, z[r]);
        const float m_new = fmaxf(m, lpd_block_max(tm, red));
        const float ref = (m_new == -INFINITY) ? 0.0f : m_new;
        float e[LPD_PER_THREAD];
#pragma unroll
        for (int r = 0; r < LPD_PER_THREAD; ++r) e[r] = tl_exp(z[r] - ref);
#pragma unroll
        for (int w = 1; w < LPD_PER_THREAD; w <<= 1)
#pragma unroll
            for (int r = 0; r < LPD_PER_THREAD; r += 2 * w) e[r] += e[r + w];
        const float tile = lpd_block_sum(e[0], red);
        s = s * tl_exp(m - ref) + tile;  // two roundings (-fmad=false)
        m = m_new;
    }
    if (threadIdx.x == 0) {
        const float ls = logf(s);
        const float zt = xr[targets[ti(row)]] / temperature;
        out[row] = (zt - m) - ls;
        rmax[row] = m;
        rlog[row] = ls;
    }
}

// The declared sequence of linear_logp's forward (the Triton kernels _fwd_partial_kernel /
// _fwd_combine_kernel with DECLARED_LSE): per (row, 4096-column chunk), the chunk's 128-column
// tiles in increasing order with an online max / sum; per tile z = logit / temperature (IEEE), the
// tile max (order-free), m_new = max(m, tile max), ref = m_new or 0 where it is -inf, the tile sum
// of tl_exp(z - ref) over column bits 0, 3, 4, 5, 6, then 2, 1 (a wgmma accumulator's row:
// fragment_row_sum), s = s * tl_exp(m - ref) + tile sum; the target's z is the max of -inf and
// the target's column where the tile holds it. Four threads (a quad) hold a tile of a row, thread t
// its columns 8 j + 2 t, + 1 (j = 0 .. 15).
//
// Only the last step, s = s * tl_exp(m - ref) + tile sum, depends on the tiles before; a tile's ref
// depends on them only through the running max m_new, a prefix max of the tile maxima (fmaxf, exact).
// So the tiles of a row run side by side: LPT_QUADS quads per row (two warps), quad q holding tiles
// q and q + LPT_QUADS in registers; step 1: every tile's max into shared memory; step 2: each quad
// takes its tiles' prefix max in tile order (the same fmaxf sequence as the online loop's) and sums
// its tiles; step 3: one thread per row runs the online update over the tiles in increasing order
// (the same operations on the same values as the one-quad loop, hence the same bits). The one-quad
// form (a row per quad, 64 rows per block) gave 64 blocks for 4096 rows: 9.7 ms for the 38 chunks of
// a 4 x 1024-token train step on an H100, about 12x its bytes' time at copy bandwidth; this form 3.1 ms
// there, and 6.3 ms (about 0.8 TB/s) for the 37 chunks of 8 x 1024-token teacher forcing, with 91
// registers (two blocks per SM) and one thread per row running step 3 at the end of each block. Its SASS
// showed why: each thread's 32 loads were issued one at a time, each beside the division of the value before
// (the IEEE division's slow-path CALL is a scheduling barrier), so a block waited for 32 round trips to
// memory; three blocks per SM (80 registers) did not change that (6.5 ms, H100, 2026-12-07). Since then
// step 0 loads every value of the thread's tiles before step 1 divides any (the same values and
// operations: the same bits): 32 loads in flight per thread, 108 registers without spill (two blocks per
// SM); where the row and its columns allow (VEC2), a thread's two neighbouring columns of a fragment row
// come in one 8-byte load.
constexpr int LPT_THREADS = 256;
constexpr int LPT_QUADS = 16;                              // quads per row
constexpr int LPT_ROWS = LPT_THREADS / (4 * LPT_QUADS);    // rows per block
constexpr int64_t LPT_TILE = 128;
constexpr int LPT_TILES = static_cast<int>(LP_CHUNK_V / LPT_TILE);  // tiles per chunk
constexpr int LPT_PER_QUAD = LPT_TILES / LPT_QUADS;        // tiles held by a quad
static_assert(LPT_TILES % LPT_QUADS == 0 && LPT_ROWS >= 1, "a chunk's tiles split evenly over a row's quads");

template <bool VEC2>
__global__ void __launch_bounds__(LPT_THREADS, 2)
lpt_partial_kernel(const float* __restrict__ buf, int64_t s_b, int64_t col_base, int64_t V, int64_t chunk,
                   int64_t rows, int64_t n_chunks, float temperature, const int64_t* __restrict__ targets,
                   int64_t s_t, float* __restrict__ part_m, float* __restrict__ part_s, float* __restrict__ part_t) {
    __shared__ float s_tmax[LPT_ROWS][LPT_TILES];   // tile maxima
    __shared__ float s_tsum[LPT_ROWS][LPT_TILES];   // tile sums
    __shared__ float s_hit[LPT_ROWS][LPT_QUADS];    // the target's z where a quad's tiles hold it, else -inf
    const int r = threadIdx.x / (4 * LPT_QUADS);   // the block's row
    const int quad = (threadIdx.x >> 2) % LPT_QUADS;
    const int t = threadIdx.x & 3;
    const int64_t row_raw = static_cast<int64_t>(blockIdx.x) * LPT_ROWS + r;
    const bool live = row_raw < rows;
    const int64_t row = live ? row_raw : rows - 1;  // a row past the rows computes row rows - 1 and stores nothing
    const float* xr = buf + row * s_b;  // global column c at xr[c - col_base]
    const int64_t tgt = targets[row * s_t];
    const int64_t lo = chunk * LP_CHUNK_V;
    const int64_t hi = (lo + LP_CHUNK_V) < V ? (lo + LP_CHUNK_V) : V;
    const int nt = static_cast<int>(cdiv(hi - lo, LPT_TILE));  // the chunk's tiles (the last: part of a tile may lie past V)
    float z[LPT_PER_QUAD][16][2];
    float hit = -INFINITY;
    // Step 0: every logit of the thread's tiles loaded before any is divided. Loads written beside the
    // divisions were issued one at a time (the IEEE division's slow-path call is a scheduling barrier in
    // SASS: each load into the same registers waited for the division of the one before), so a block spent
    // its time in 32 global-memory round trips per thread.
#pragma unroll
    for (int k = 0; k < LPT_PER_QUAD; ++k) {
        const int i = quad + LPT_QUADS * k;
        const int64_t v0 = lo + LPT_TILE * i;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int64_t c0 = v0 + 8 * j + 2 * t;
            z[k][j][0] = 0.0f;
            z[k][j][1] = 0.0f;
            if (VEC2) {  // (V even: c0 < V means c0 + 1 < V; the row and c0 - col_base even: 8-byte aligned)
                if (i < nt && c0 < V) {
                    const float2 p = *reinterpret_cast<const float2*>(xr + (c0 - col_base));
                    z[k][j][0] = p.x;
                    z[k][j][1] = p.y;
                }
            } else {
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    if (i < nt && c0 + e < V) z[k][j][e] = xr[c0 + e - col_base];
            }
        }
    }
#pragma unroll
    for (int k = 0; k < LPT_PER_QUAD; ++k) {  // step 1: the tiles' z and maxima
        const int i = quad + LPT_QUADS * k;
        const int64_t v0 = lo + LPT_TILE * i;
        float tm = -INFINITY;
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int64_t c0 = v0 + 8 * j + 2 * t;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int64_t c = c0 + e;
                z[k][j][e] = (i < nt && c < V) ? z[k][j][e] / temperature : -INFINITY;
                tm = fmaxf(tm, z[k][j][e]);
                if (i < nt && c == tgt) hit = z[k][j][e];
            }
        }
        tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 1));
        tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, 2));
        if (i < nt && t == 0) s_tmax[r][i] = tm;
    }
    hit = fmaxf(hit, __shfl_xor_sync(0xffffffffu, hit, 1));
    hit = fmaxf(hit, __shfl_xor_sync(0xffffffffu, hit, 2));
    if (t == 0) s_hit[r][quad] = hit;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < LPT_PER_QUAD; ++k) {  // step 2: the tiles' sums at their running max
        const int i = quad + LPT_QUADS * k;
        float q = 0.0f;
        if (i < nt) {
            float m = -INFINITY;  // the running max before tile i
            for (int p = 0; p < i; ++p) m = fmaxf(m, s_tmax[r][p]);
            const float m_new = fmaxf(m, s_tmax[r][i]);
            const float ref = (m_new == -INFINITY) ? 0.0f : m_new;
            float v[16];
#pragma unroll
            for (int j = 0; j < 16; ++j) v[j] = tl_exp(z[k][j][0] - ref) + tl_exp(z[k][j][1] - ref);  // bit 0
#pragma unroll
            for (int w = 1; w < 16; w <<= 1)  // bits 3, 4, 5, 6
#pragma unroll
                for (int j = 0; j < 16; j += 2 * w) v[j] += v[j + w];
            q = v[0];
        }
        q += __shfl_xor_sync(0xffffffffu, q, 2);  // bit 2
        q += __shfl_xor_sync(0xffffffffu, q, 1);  // bit 1
        if (i < nt && t == 0) s_tsum[r][i] = q;
    }
    __syncthreads();
    if (live && quad == 0 && t == 0) {  // step 3: the online update, tile by tile
        float m = -INFINITY;
        float s = 0.0f;
        for (int i = 0; i < nt; ++i) {
            const float m_new = fmaxf(m, s_tmax[r][i]);
            const float ref = (m_new == -INFINITY) ? 0.0f : m_new;
            s = s * tl_exp(m - ref) + s_tsum[r][i];  // two roundings (-fmad=false)
            m = m_new;
        }
        float zt = -INFINITY;
        for (int qq = 0; qq < LPT_QUADS; ++qq) zt = fmaxf(zt, s_hit[r][qq]);
        const int64_t o = row * n_chunks + chunk;
        part_m[o] = m;
        part_s[o] = s;
        part_t[o] = zt;
    }
}

// The chunks of each row in increasing order (Triton's _fwd_combine_kernel): m_new = max(m, pm),
// ref as above, s = s * tl_exp(m - ref) + ps * tl_exp(pm - ref), the target's z the max over the
// chunks; out = (z_t - m) - logf(s), keeping m and logf(s).
__global__ void __launch_bounds__(LP_FINISH_THREADS)
lpt_finish_kernel(const float* __restrict__ part_m, const float* __restrict__ part_s, const float* __restrict__ part_t,
                  int64_t rows, int64_t n_chunks, float* __restrict__ out, float* __restrict__ rmax,
                  float* __restrict__ rlog) {
    const int64_t row = static_cast<int64_t>(blockIdx.x) * LP_FINISH_THREADS + threadIdx.x;
    if (row >= rows) return;
    float m = -INFINITY;
    float s = 0.0f;
    float zt = -INFINITY;
    for (int64_t c = 0; c < n_chunks; ++c) {
        const float pm = part_m[row * n_chunks + c];
        const float ps = part_s[row * n_chunks + c];
        const float m_new = fmaxf(m, pm);
        const float ref = (m_new == -INFINITY) ? 0.0f : m_new;
        s = s * tl_exp(m - ref) + ps * tl_exp(pm - ref);
        m = m_new;
        zt = fmaxf(zt, part_t[row * n_chunks + c]);
    }
    const float ls = logf(s);
    out[row] = (zt - m) - ls;
    rmax[row] = m;
    rlog[row] = ls;
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

namespace {
template <bool TL_EXP>
int launch_lp_bwd(const void* src, int64_t s_so, int64_t s_si, void* dst, int64_t s_do, int64_t s_di, int64_t rows,
                  int64_t n_inner, int64_t col_base, int64_t ncols, float temperature, const void* targets, int64_t s_to,
                  int64_t s_ti, const void* mask, int64_t s_mo, int64_t s_mi, const void* g, const void* rmax,
                  const void* rlog, void* stream) {
    if (rows == 0 || ncols == 0) return 0;
    const int64_t col_blocks = cdiv(ncols, LP_BWD_COLS);
    if (rows >= 2147483647LL || col_blocks > 65535 || n_inner <= 0) return static_cast<int>(cudaErrorInvalidValue);
    dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(col_blocks));
    lp_bwd_kernel<TL_EXP><<<grid, LP_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(src), RowIndex{n_inner, s_so, s_si}, static_cast<float*>(dst),
        RowIndex{n_inner, s_do, s_di}, col_base, ncols, temperature, static_cast<const int64_t*>(targets),
        RowIndex{n_inner, s_to, s_ti}, static_cast<const uint8_t*>(mask), RowIndex{n_inner, s_mo, s_mi},
        static_cast<const float*>(g), static_cast<const float*>(rmax), static_cast<const float*>(rlog));
    return launch_status();
}
}  // namespace

// dlogits for global columns [col_base, col_base + ncols): src / dst rows addressed like buf above
// (dst may equal src). g, rmax, rlog: [rows] fp32. p = expf(...) (the chunked sequence; linear_logp).
RL_EXPORT int rl_logp_bwd(const void* src, int64_t s_so, int64_t s_si, void* dst, int64_t s_do, int64_t s_di, int64_t rows, int64_t n_inner, int64_t col_base, int64_t ncols, float temperature, const void* targets, int64_t s_to, int64_t s_ti, const void* mask, int64_t s_mo, int64_t s_mi, const void* g, const void* rmax, const void* rlog, void* stream) {
    return launch_lp_bwd<false>(src, s_so, s_si, dst, s_do, s_di, rows, n_inner, col_base, ncols, temperature, targets,
                                s_to, s_ti, mask, s_mo, s_mi, g, rmax, rlog, stream);
}

// The declared sequence's forward (lpd_fwd_kernel): logits rows addressed like rl_logp_partial's buf
// (col_base 0, all V columns); out, rmax, rlog: [rows] fp32 (0 where the mask is 0).
RL_EXPORT int rl_logp_declared_fwd(const void* buf, int64_t rows, int64_t n_inner, int64_t s_bo, int64_t s_bi, int64_t V, float temperature, const void* targets, int64_t s_to, int64_t s_ti, const void* mask, int64_t s_mo, int64_t s_mi, void* out, void* rmax, void* rlog, void* stream) {
    if (rows == 0) return 0;
    if (rows >= 2147483647LL || n_inner <= 0 || V <= 0) return static_cast<int>(cudaErrorInvalidValue);
    lpd_fwd_kernel<<<static_cast<unsigned>(rows), LPD_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(buf), RowIndex{n_inner, s_bo, s_bi}, V, temperature, static_cast<const int64_t*>(targets),
        RowIndex{n_inner, s_to, s_ti}, static_cast<const uint8_t*>(mask), RowIndex{n_inner, s_mo, s_mi},
        static_cast<float*>(out), static_cast<float*>(rmax), static_cast<float*>(rlog));
    return launch_status();
}

// The declared sequences' backward (logp, batch_invariant_logp and linear_logp's chunks): rl_logp_bwd
// with p = tl_exp((z - m) - log s).
RL_EXPORT int rl_logp_declared_bwd(const void* src, int64_t s_so, int64_t s_si, void* dst, int64_t s_do, int64_t s_di, int64_t rows, int64_t n_inner, int64_t col_base, int64_t ncols, float temperature, const void* targets, int64_t s_to, int64_t s_ti, const void* mask, int64_t s_mo, int64_t s_mi, const void* g, const void* rmax, const void* rlog, void* stream) {
    return launch_lp_bwd<true>(src, s_so, s_si, dst, s_do, s_di, rows, n_inner, col_base, ncols, temperature, targets,
                               s_to, s_ti, mask, s_mo, s_mi, g, rmax, rlog, stream);
}

// linear_logp's declared forward, one V chunk: buf [rows, *] fp32 (row stride s_b) holds global column
// col_base at offset 0; part_m / part_s / part_t: [rows, n_chunks] fp32 (column `chunk` written).
RL_EXPORT int rl_logp_tiled_partial(const void* buf, int64_t s_b, int64_t col_base, int64_t V, int64_t chunk, int64_t rows, int64_t n_chunks, float temperature, const void* targets, int64_t s_t, void* part_m, void* part_s, void* part_t, void* stream) {
    if (rows == 0) return 0;
    const int64_t blocks = cdiv(rows, LPT_ROWS);
    if (blocks >= 2147483647LL || V <= 0 || chunk < 0 || chunk >= n_chunks) return static_cast<int>(cudaErrorInvalidValue);
    // 8-byte loads where every pair a thread loads is aligned and inside V (V even)
    const bool vec2 = (reinterpret_cast<uintptr_t>(buf) & 7u) == 0 && s_b % 2 == 0 && col_base % 2 == 0 && V % 2 == 0;
    const auto kernel = vec2 ? lpt_partial_kernel<true> : lpt_partial_kernel<false>;
    kernel<<<static_cast<unsigned>(blocks), LPT_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(buf), s_b, col_base, V, chunk, rows, n_chunks, temperature,
        static_cast<const int64_t*>(targets), s_t, static_cast<float*>(part_m), static_cast<float*>(part_s),
        static_cast<float*>(part_t));
    return launch_status();
}

// linear_logp's declared combine of the chunk partials: out, rmax, rlog [rows] fp32.
RL_EXPORT int rl_logp_tiled_finish(const void* part_m, const void* part_s, const void* part_t, int64_t rows, int64_t n_chunks, void* out, void* rmax, void* rlog, void* stream) {
    if (rows == 0) return 0;
    lpt_finish_kernel<<<static_cast<unsigned>(cdiv(rows, LP_FINISH_THREADS)), LP_FINISH_THREADS, 0,
                        static_cast<cudaStream_t>(stream)>>>(
        static_cast<const float*>(part_m), static_cast<const float*>(part_s), static_cast<const float*>(part_t), rows,
        n_chunks, static_cast<float*>(out), static_cast<float*>(rmax), static_cast<float*>(rlog));
    return launch_status();
}
