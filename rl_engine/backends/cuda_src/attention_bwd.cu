// Backward of the causal varlen GQA attention (see attention.cu for the design notes):
// delta = rowsum(dO * O); dQ per 64 queries of one head; dK / dV per 64 keys of one KV head.
// Deterministic, no atomics, in one of two forms (rl_attention_bwd_form):
//   0: every gradient element is a sequential FP32 FMA chain in a fixed order (CUDA cores);
//   1: tensor cores (attn_bwd_dq_tc_kernel, attn_bwd_dkdv_tc_kernel; head dims 16 to 128, else form 0):
//      S = Q K^T and dP = dO V^T as mma.sync m16n8k16 products over D in increasing k16 steps (FP32
//      accumulators), P = exp(S * scale - lse) and dS = P (dP - delta) in FP32 as in form 0, then P
//      and dS rounded to BF16 for dV += P^T dO, dK += dS^T Q and dQ += dS K, k16 products over the
//      block's 64 queries / keys in increasing order, blocks in the same fixed order as form 0.
//      Each output element's sequence depends only on its own row and the sequence-aligned blocks,
//      so batch, padding and layout invariance hold as in form 0. Masked terms are absent (the
//      contract's masked_positions): in a block that holds masked terms, the other operand's
//      non-finite values are made 0 for the product and the output elements that a visible
//      non-finite value reaches are set to NaN afterwards, as the Triton backend's _absent_mma does.
#include "attention.cuh"

using namespace rl;
using namespace rl::attn;

namespace {

// delta[h, t] = sum_d dO[t, h, d] * O[t, h, d]: one warp per (t, h), lanes over d in order, butterfly.
__global__ void __launch_bounds__(AT_THREADS)
attn_delta_kernel(const bf16* __restrict__ o, const bf16* __restrict__ dout, float* __restrict__ delta, int64_t tq,
                  int64_t heads, int64_t d_size, int64_t s_ot, int64_t s_oh, int64_t s_dt, int64_t s_dh, int64_t s_lh) {
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * (AT_THREADS / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (idx >= tq * heads) return;  // uniform over the warp
    const int64_t t = idx / heads;
    const int64_t h = idx % heads;
    const bf16* orow = o + t * s_ot + h * s_oh;
    const bf16* drow = dout + t * s_dt + h * s_dh;
    float acc = 0.0f;
    for (int64_t d = lane; d < d_size; d += 32) acc += f32(orow[d]) * f32(drow[d]);
    acc = warp_sum(acc);
    if (lane == 0) delta[h * s_lh + t] = acc;
}

template <int D>
constexpr size_t dq_smem() {
    return static_cast<size_t>(2 * AT_GROUPS * AT_RPT_PREFILL + 2 * AT_BKV) * Ld<D>::value * sizeof(bf16) +
           static_cast<size_t>(AT_GROUPS * AT_RPT_PREFILL) * AT_PS_LD * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(AT_THREADS)
attn_bwd_dq_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                   const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                   bf16* __restrict__ dq, const int32_t* __restrict__ cu_q, const int32_t* __restrict__ cu_k,
                   int64_t n_mblocks, int64_t group, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh,
                   int64_t s_vt, int64_t s_vh, int64_t s_dt, int64_t s_dh, int64_t s_lh, int64_t s_gt, int64_t s_gh,
                   float scale) {
    constexpr int RPT = AT_RPT_PREFILL;
    constexpr int BQ = AT_GROUPS * RPT;
    constexpr int LD = Ld<D>::value;
    constexpr int DPT = D / AT_LANES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* dos = qs + BQ * LD;
    bf16* ks = dos + BQ * LD;
    bf16* vs = ks + AT_BKV * LD;
    float* dss = reinterpret_cast<float*>(vs + AT_BKV * LD);

    const int64_t b = blockIdx.x / n_mblocks;
    const int64_t q0 = (blockIdx.x % n_mblocks) * BQ;
    const int64_t h = blockIdx.y;
    const int64_t q_start = cu_q[b];
    const int64_t q_len = static_cast<int64_t>(cu_q[b + 1]) - q_start;
    if (q0 >= q_len) return;
    const int64_t k_start = cu_k[b];
    const int64_t k_len = static_cast<int64_t>(cu_k[b + 1]) - k_start;
    const int64_t offset = k_len - q_len;
    const int64_t kvh = h / group;
    const int rg = threadIdx.x / AT_LANES;
    const int cs = threadIdx.x % AT_LANES;

    load_rows<D, BQ>(qs, q + q_start * s_qt + h * s_qh, s_qt, q0, q_len);
    load_rows<D, BQ>(dos, dout + q_start * s_dt + h * s_dh, s_dt, q0, q_len);
    int64_t lim[RPT];
    float lse_r[RPT], delta_r[RPT];
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        const int64_t qi = q0 + rg + AT_GROUPS * i;
        const bool ok = qi < q_len;
        lim[i] = ok ? offset + qi : -1;
        lse_r[i] = ok ? lse[h * s_lh + q_start + qi] : 0.0f;
        delta_r[i] = ok ? delta[h * s_lh + q_start + qi] : 0.0f;
    }
    const bf16* k_base = k + k_start * s_kt + kvh * s_kh;
    const bf16* v_base = v + k_start * s_vt + kvh * s_vh;
    const int64_t n_stop = (offset + q0 + BQ) < k_len ? (offset + q0 + BQ) : k_len;
    float acc[RPT][DPT];
#pragma unroll
    for (int i = 0; i < RPT; ++i)
#pragma unroll
        for (int dj = 0; dj < DPT; ++dj) acc[i][dj] = 0.0f;

    for (int64_t kv0 = 0; kv0 < n_stop; kv0 += AT_BKV) {
        __syncthreads();
        load_rows<D, AT_BKV>(ks, k_base, s_kt, kv0, k_len);
        load_rows<D, AT_BKV>(vs, v_base, s_vt, kv0, k_len);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const int r = rg + AT_GROUPS * i;
#pragma unroll
            for (int jj = 0; jj < AT_CPT; ++jj) {
                const int c = cs + AT_LANES * jj;
                const float s = dot_row<D>(qs + r * LD, ks + c * LD) * scale;
                const float dp = dot_row<D>(dos + r * LD, vs + c * LD);
                const bool vis = kv0 + c <= lim[i];
                const float p = vis ? expf(s - lse_r[i]) : 0.0f;
                dss[r * AT_PS_LD + c] = absent_if_masked(p * (dp - delta_r[i]), vis);
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const int r = rg + AT_GROUPS * i;
            if (kv0 + AT_BKV - 1 <= lim[i]) {  // the row sees the whole block
                for (int j = 0; j < AT_BKV; ++j) {
                    const float ds = dss[r * AT_PS_LD + j];
                    const bf16* kr = ks + j * LD + cs;
#pragma unroll
                    for (int dj = 0; dj < DPT; ++dj) acc[i][dj] = __fmaf_rn(ds, f32(kr[AT_LANES * dj]), acc[i][dj]);
                }
            } else {  // masked keys (ds = 0): their k is absent, not 0 * k
                for (int j = 0; j < AT_BKV; ++j) {
                    const float ds = dss[r * AT_PS_LD + j];
                    const bool vis = kv0 + j <= lim[i];
                    const bf16* kr = ks + j * LD + cs;
#pragma unroll
                    for (int dj = 0; dj < DPT; ++dj)
                        acc[i][dj] = __fmaf_rn(ds, absent_if_masked(f32(kr[AT_LANES * dj]), vis), acc[i][dj]);
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        const int64_t qi = q0 + rg + AT_GROUPS * i;
        if (qi >= q_len) continue;
        bf16* grow = dq + (q_start + qi) * s_gt + h * s_gh;
#pragma unroll
        for (int dj = 0; dj < DPT; ++dj) grow[cs + AT_LANES * dj] = to_bf16(acc[i][dj] * scale);
    }
}

template <int D>
constexpr size_t dkdv_smem() {
    return static_cast<size_t>(2 * AT_BKV + 2 * AT_BQ_BWD) * Ld<D>::value * sizeof(bf16) +
           static_cast<size_t>(2 * AT_BQ_BWD) * sizeof(float) + static_cast<size_t>(2 * AT_BKV) * AT_PS_LD * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(AT_THREADS)
attn_bwd_dkdv_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                     const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                     bf16* __restrict__ dk, bf16* __restrict__ dv, const int32_t* __restrict__ cu_q,
                     const int32_t* __restrict__ cu_k, int64_t n_nblocks, int64_t group, int64_t s_qt, int64_t s_qh,
                     int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_dt, int64_t s_dh, int64_t s_lh,
                     int64_t s_dkt, int64_t s_dkh, int64_t s_dvt, int64_t s_dvh, float scale) {
    constexpr int RPT = AT_BKV / AT_GROUPS;  // 4 keys per thread
    constexpr int LD = Ld<D>::value;
    constexpr int DPT = D / AT_LANES;
    constexpr int QPT = AT_BQ_BWD / AT_LANES;  // 4 queries per lane
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* ks = reinterpret_cast<bf16*>(smem_raw);
    bf16* vs = ks + AT_BKV * LD;
    bf16* qs = vs + AT_BKV * LD;
    bf16* dos = qs + AT_BQ_BWD * LD;
    float* lse_s = reinterpret_cast<float*>(dos + AT_BQ_BWD * LD);
    float* delta_s = lse_s + AT_BQ_BWD;
    float* pts = delta_s + AT_BQ_BWD;
    float* dsts = pts + AT_BKV * AT_PS_LD;

    const int64_t b = blockIdx.x / n_nblocks;
    const int64_t kv0 = (blockIdx.x % n_nblocks) * AT_BKV;
    const int64_t kvh = blockIdx.y;
    const int64_t k_start = cu_k[b];
    const int64_t k_len = static_cast<int64_t>(cu_k[b + 1]) - k_start;
    if (kv0 >= k_len) return;
    const int64_t q_start = cu_q[b];
    const int64_t q_len = static_cast<int64_t>(cu_q[b + 1]) - q_start;
    const int64_t offset = k_len - q_len;  // position of query 0
    const int rg = threadIdx.x / AT_LANES;
    const int cs = threadIdx.x % AT_LANES;

    load_rows<D, AT_BKV>(ks, k + k_start * s_kt + kvh * s_kh, s_kt, kv0, k_len);
    load_rows<D, AT_BKV>(vs, v + k_start * s_vt + kvh * s_vh, s_vt, kv0, k_len);
    float gk[RPT][DPT], gv[RPT][DPT];
#pragma unroll
    for (int i = 0; i < RPT; ++i)
#pragma unroll
        for (int dj = 0; dj < DPT; ++dj) {
            gk[i][dj] = 0.0f;
            gv[i][dj] = 0.0f;
        }
    // The first query that sees key kv0 is kv0 - offset; start at the sequence-aligned block holding it.
    const int64_t first = (kv0 - offset) > 0 ? (kv0 - offset) : 0;
    const int64_t m_begin = (first / AT_BQ_BWD) * AT_BQ_BWD;
    for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        for (int64_t m0 = m_begin; m0 < q_len; m0 += AT_BQ_BWD) {
            __syncthreads();  // previous step's tiles are no longer read
            load_rows<D, AT_BQ_BWD>(qs, q + q_start * s_qt + h * s_qh, s_qt, m0, q_len);
            load_rows<D, AT_BQ_BWD>(dos, dout + q_start * s_dt + h * s_dh, s_dt, m0, q_len);
            for (int r = threadIdx.x; r < AT_BQ_BWD; r += AT_THREADS) {
                const bool ok = m0 + r < q_len;
                lse_s[r] = ok ? lse[h * s_lh + q_start + m0 + r] : 0.0f;
                delta_s[r] = ok ? delta[h * s_lh + q_start + m0 + r] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const int jr = rg + AT_GROUPS * i;
                const int64_t key = kv0 + jr;
#pragma unroll
                for (int jj = 0; jj < QPT; ++jj) {
                    const int ic = cs + AT_LANES * jj;
                    const int64_t qi = m0 + ic;
                    const float s = dot_row<D>(ks + jr * LD, qs + ic * LD) * scale;
                    const float dp = dot_row<D>(vs + jr * LD, dos + ic * LD);
                    const bool visible = key < k_len && qi < q_len && key <= offset + qi;
                    const float p = visible ? expf(s - lse_s[ic]) : 0.0f;
                    pts[jr * AT_PS_LD + ic] = p;
                    dsts[jr * AT_PS_LD + ic] = absent_if_masked(p * (dp - delta_s[ic]), visible);
                }
            }
            __syncthreads();
            // Every query of the step sees every key of the block when its first query does
            // (and all of them are real): the plain loop. Otherwise (causal diagonal, padding
            // queries) the q / dO of queries that cannot see a key are absent, not 0 * q.
            const bool whole = m0 + AT_BQ_BWD <= q_len && kv0 + AT_BKV - 1 <= offset + m0;
#pragma unroll
            for (int i = 0; i < RPT; ++i) {
                const int jr = rg + AT_GROUPS * i;
                const int64_t key = kv0 + jr;
                for (int qq = 0; qq < AT_BQ_BWD; ++qq) {
                    const float p = pts[jr * AT_PS_LD + qq];
                    const float ds = dsts[jr * AT_PS_LD + qq];
                    const bf16* dor = dos + qq * LD + cs;
                    const bf16* qr = qs + qq * LD + cs;
                    if (whole) {
#pragma unroll
                        for (int dj = 0; dj < DPT; ++dj) {
                            gv[i][dj] = __fmaf_rn(p, f32(dor[AT_LANES * dj]), gv[i][dj]);
                            gk[i][dj] = __fmaf_rn(ds, f32(qr[AT_LANES * dj]), gk[i][dj]);
                        }
                    } else {
                        const bool vis = key < k_len && m0 + qq < q_len && key <= offset + m0 + qq;
#pragma unroll
                        for (int dj = 0; dj < DPT; ++dj) {
                            gv[i][dj] = __fmaf_rn(p, absent_if_masked(f32(dor[AT_LANES * dj]), vis), gv[i][dj]);
                            gk[i][dj] = __fmaf_rn(ds, absent_if_masked(f32(qr[AT_LANES * dj]), vis), gk[i][dj]);
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        const int64_t key = kv0 + rg + AT_GROUPS * i;
        if (key >= k_len) continue;
        bf16* dkr = dk + (k_start + key) * s_dkt + kvh * s_dkh;
        bf16* dvr = dv + (k_start + key) * s_dvt + kvh * s_dvh;
#pragma unroll
        for (int dj = 0; dj < DPT; ++dj) {
            dkr[cs + AT_LANES * dj] = to_bf16(gk[i][dj] * scale);
            dvr[cs + AT_LANES * dj] = to_bf16(gv[i][dj]);
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Tensor-core form (rl_attention_bwd_form 1). Four warps; warp w owns rows [16 w, 16 w + 16) of the
// block's 64 rows (queries for dQ, keys for dK / dV). Shared tiles are 64 rows of D + 8 BF16 (16-byte
// aligned rows for ldmatrix, the 16-byte skew keeps the eight rows of a matrix on distinct banks).
constexpr int TC_THREADS = 128;
constexpr int TC_ROWS = 64;

template <int D>
struct TcLd {
    static constexpr int value = D + 8;
};

// Rows [0, 64) of a tile: row r from base + (row0 + r) * stride when row0 + r < limit, else zeros.
template <int D>
__device__ __forceinline__ void tc_load_rows(bf16* dst, const bf16* base, int64_t stride, int64_t row0, int64_t limit) {
    constexpr int LD = TcLd<D>::value;
    constexpr int VEC = 8;
    constexpr int VPR = D / VEC;
    if (aligned16(base) && stride % VEC == 0) {
        for (int e = threadIdx.x; e < TC_ROWS * VPR; e += TC_THREADS) {
            const int r = e / VPR;
            const int c = (e % VPR) * VEC;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (row0 + r < limit) v = __ldg(reinterpret_cast<const uint4*>(base + (row0 + r) * stride + c));
            *reinterpret_cast<uint4*>(dst + r * LD + c) = v;
        }
        return;
    }
    for (int e = threadIdx.x; e < TC_ROWS * D; e += TC_THREADS) {
        const int r = e / D;
        const int c = e % D;
        dst[r * LD + c] = row0 + r < limit ? base[(row0 + r) * stride + c] : to_bf16(0.0f);
    }
}

// acc[n][.] += A B^T for the warp's 16 rows of A (a_rows, row-major [16][D]) and the 64 rows of B
// (b_rows, [64][D]): eight 16 x 8 output tiles, the k16 products over D in increasing order.
template <int D>
__device__ __forceinline__ void tc_abt(float (&acc)[8][4], const bf16* a_rows, const bf16* b_rows) {
    constexpr int LD = TcLd<D>::value;
    const int lane = threadIdx.x % 32;
    const int mat = lane / 8;
    const int r8 = lane % 8;
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t a[4];
        ldsm_x4(a, a_rows + ((mat % 2) * 8 + r8) * LD + k0 + (mat / 2) * 8);
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            uint32_t b[4];
            ldsm_x4(b, b_rows + (np * 16 + (mat / 2) * 8 + r8) * LD + k0 + (mat % 2) * 8);
            const uint32_t b0[2] = {b[0], b[1]};
            const uint32_t b1[2] = {b[2], b[3]};
            mma_bf16_16816(acc[2 * np], a, b0);
            mma_bf16_16816(acc[2 * np + 1], a, b1);
        }
    }
}

// acc[n][.] += A B for A = the warp's 16 x 64 BF16 fragments pa (four k16 A fragments) and B = the
// 64 rows of b_rows ([64][D], k = the row): D / 8 output tiles, the k16 products in increasing k.
template <int D>
__device__ __forceinline__ void tc_ab(float (&acc)[D / 8][4], const uint32_t (&pa)[4][4], const bf16* b_rows) {
    constexpr int LD = TcLd<D>::value;
    const int lane = threadIdx.x % 32;
    const int mat = lane / 8;
    const int r8 = lane % 8;
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            uint32_t b[4];
            ldsm_x4_t(b, b_rows + (kt * 16 + (mat % 2) * 8 + r8) * LD + np * 16 + (mat / 2) * 8);
            const uint32_t b0[2] = {b[0], b[1]};
            const uint32_t b1[2] = {b[2], b[3]};
            mma_bf16_16816(acc[2 * np], pa[kt], b0);
            mma_bf16_16816(acc[2 * np + 1], pa[kt], b1);
        }
    }
}

// The block's two score tiles from fresh FP32 accumulators: s = A B^T (the scores, S or S^T) and
// dp = C E^T (dP or dP^T), for the warp's 16 rows of A / C and the 64 rows of B / E.
template <int D>
__device__ __forceinline__ void tc_scores(float (&s)[8][4], float (&dp)[8][4], const bf16* a, const bf16* b,
                                          const bf16* c, const bf16* e) {
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s[n][i] = 0.0f;
            dp[n][i] = 0.0f;
        }
    tc_abt<D>(s, a, b);
    tc_abt<D>(dp, c, e);
}

__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
    const bf16 l = to_bf16(lo);
    const bf16 h = to_bf16(hi);
    return static_cast<uint32_t>(bits(&l)) | (static_cast<uint32_t>(bits(&h)) << 16);
}

// The accumulator tiles of a 16 x 64 product as the four k16 A fragments of the next product
// (the m16n8 output layout is the m16k16 input layout, two tiles at a time), rounded to BF16.
__device__ __forceinline__ void tc_to_a(uint32_t (&pa)[4][4], const float (&c)[8][4]) {
#pragma unroll
    for (int kt = 0; kt < 4; ++kt) {
        pa[kt][0] = tc_pack(c[2 * kt][0], c[2 * kt][1]);
        pa[kt][1] = tc_pack(c[2 * kt][2], c[2 * kt][3]);
        pa[kt][2] = tc_pack(c[2 * kt + 1][0], c[2 * kt + 1][1]);
        pa[kt][3] = tc_pack(c[2 * kt + 1][2], c[2 * kt + 1][3]);
    }
}

template <int D>
constexpr size_t dq_tc_smem() {
    return static_cast<size_t>(4 * TC_ROWS * TcLd<D>::value) * sizeof(bf16) + static_cast<size_t>(D) * sizeof(int);
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
attn_bwd_dq_tc_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                      const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                      bf16* __restrict__ dq, const int32_t* __restrict__ cu_q, const int32_t* __restrict__ cu_k,
                      int64_t n_mblocks, int64_t group, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh,
                      int64_t s_vt, int64_t s_vh, int64_t s_dt, int64_t s_dh, int64_t s_lh, int64_t s_gt,
                      int64_t s_gh, float scale) {
    constexpr int LD = TcLd<D>::value;
    constexpr int NT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* dos = qs + TC_ROWS * LD;
    bf16* ks = dos + TC_ROWS * LD;
    bf16* vs = ks + TC_ROWS * LD;
    int* first_bad = reinterpret_cast<int*>(vs + TC_ROWS * LD);  // per column: first key whose k is not finite

    const int64_t b = blockIdx.x / n_mblocks;
    const int64_t q0 = (blockIdx.x % n_mblocks) * TC_ROWS;
    const int64_t h = blockIdx.y;
    const int64_t q_start = cu_q[b];
    const int64_t q_len = static_cast<int64_t>(cu_q[b + 1]) - q_start;
    if (q0 >= q_len) return;
    const int64_t k_start = cu_k[b];
    const int64_t k_len = static_cast<int64_t>(cu_k[b + 1]) - k_start;
    const int64_t offset = k_len - q_len;
    const int64_t kvh = h / group;
    const int warp = threadIdx.x / 32;
    const int gq = (threadIdx.x % 32) / 4;
    const int tq = threadIdx.x % 4;

    tc_load_rows<D>(qs, q + q_start * s_qt + h * s_qh, s_qt, q0, q_len);
    tc_load_rows<D>(dos, dout + q_start * s_dt + h * s_dh, s_dt, q0, q_len);
    int64_t lim[2];
    float lse_r[2], delta_r[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int64_t qi = q0 + warp * 16 + gq + 8 * i;
        const bool ok = qi < q_len;
        lim[i] = ok ? offset + qi : -1;
        lse_r[i] = ok ? lse[h * s_lh + q_start + qi] : 0.0f;
        delta_r[i] = ok ? delta[h * s_lh + q_start + qi] : 0.0f;
    }
    const bf16* k_base = k + k_start * s_kt + kvh * s_kh;
    const bf16* v_base = v + k_start * s_vt + kvh * s_vh;
    const int64_t n_stop = (offset + q0 + TC_ROWS) < k_len ? (offset + q0 + TC_ROWS) : k_len;
    const int64_t n_full = ((offset + q0 + 1) / AT_BKV) * AT_BKV;  // blocks every real row sees whole
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;

    for (int64_t kv0 = 0; kv0 < n_stop; kv0 += AT_BKV) {
        __syncthreads();
        tc_load_rows<D>(ks, k_base, s_kt, kv0, k_len);
        tc_load_rows<D>(vs, v_base, s_vt, kv0, k_len);
        __syncthreads();
        float s[8][4], dp[8][4];
        tc_scores<D>(s, dp, qs + warp * 16 * LD, ks, dos + warp * 16 * LD, vs);
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = e / 2;
                const bool vis = kv0 + n * 8 + 2 * tq + e % 2 <= lim[i];
                const float p = vis ? expf(s[n][e] * scale - lse_r[i]) : 0.0f;
                s[n][e] = vis ? p * (dp[n][e] - delta_r[i]) : 0.0f;  // dS
            }
        uint32_t pa[4][4];
        tc_to_a(pa, s);
        const bool masked = kv0 >= n_full;  // the block holds masked keys for some row
        if (masked) {
            __syncthreads();  // every warp has read this block's k for S
            for (int d = threadIdx.x; d < D; d += TC_THREADS) {
                int first = AT_BKV;
                for (int j = AT_BKV - 1; j >= 0; --j)
                    if (!finite(f32(ks[j * LD + d]))) {
                        first = j;
                        ks[j * LD + d] = to_bf16(0.0f);
                    }
                first_bad[d] = first;
            }
            __syncthreads();
        }
        tc_ab<D>(acc, pa, ks);
        if (masked) {  // a visible non-finite k reaches its output elements
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = first_bad[n * 8 + 2 * tq + e % 2];
                    if (j < AT_BKV && kv0 + j <= lim[e / 2]) acc[n][e] = NAN;
                }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int64_t qi = q0 + warp * 16 + gq + 8 * i;
        if (qi >= q_len) continue;
        bf16* grow = dq + (q_start + qi) * s_gt + h * s_gh;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) grow[n * 8 + 2 * tq + c] = to_bf16(acc[n][2 * i + c] * scale);
    }
}

template <int D>
constexpr size_t dkdv_tc_smem() {
    return static_cast<size_t>(4 * TC_ROWS * TcLd<D>::value) * sizeof(bf16) +
           static_cast<size_t>(2 * TC_ROWS) * sizeof(float) + static_cast<size_t>(2 * D) * sizeof(int);
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
attn_bwd_dkdv_tc_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                        const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                        bf16* __restrict__ dk, bf16* __restrict__ dv, const int32_t* __restrict__ cu_q,
                        const int32_t* __restrict__ cu_k, int64_t n_nblocks, int64_t group, int64_t s_qt,
                        int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_dt,
                        int64_t s_dh, int64_t s_lh, int64_t s_dkt, int64_t s_dkh, int64_t s_dvt, int64_t s_dvh,
                        float scale) {
    constexpr int LD = TcLd<D>::value;
    constexpr int NT = D / 8;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* ks = reinterpret_cast<bf16*>(smem_raw);
    bf16* vs = ks + TC_ROWS * LD;
    bf16* qs = vs + TC_ROWS * LD;
    bf16* dos = qs + TC_ROWS * LD;
    float* lse_s = reinterpret_cast<float*>(dos + TC_ROWS * LD);
    float* delta_s = lse_s + TC_ROWS;
    int* last_bad_q = reinterpret_cast<int*>(delta_s + TC_ROWS);  // per column: last query whose q is not finite
    int* last_bad_do = last_bad_q + D;

    const int64_t b = blockIdx.x / n_nblocks;
    const int64_t kv0 = (blockIdx.x % n_nblocks) * AT_BKV;
    const int64_t kvh = blockIdx.y;
    const int64_t k_start = cu_k[b];
    const int64_t k_len = static_cast<int64_t>(cu_k[b + 1]) - k_start;
    if (kv0 >= k_len) return;
    const int64_t q_start = cu_q[b];
    const int64_t q_len = static_cast<int64_t>(cu_q[b + 1]) - q_start;
    const int64_t offset = k_len - q_len;  // position of query 0
    const int warp = threadIdx.x / 32;
    const int gq = (threadIdx.x % 32) / 4;
    const int tq = threadIdx.x % 4;

    tc_load_rows<D>(ks, k + k_start * s_kt + kvh * s_kh, s_kt, kv0, k_len);
    tc_load_rows<D>(vs, v + k_start * s_vt + kvh * s_vh, s_vt, kv0, k_len);
    const int64_t key[2] = {kv0 + warp * 16 + gq, kv0 + warp * 16 + gq + 8};
    float gk[NT][4], gv[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            gk[n][e] = 0.0f;
            gv[n][e] = 0.0f;
        }
    // The first query that sees key kv0 is kv0 - offset; start at the sequence-aligned block holding it.
    const int64_t first = (kv0 - offset) > 0 ? (kv0 - offset) : 0;
    const int64_t m_begin = (first / AT_BQ_BWD) * AT_BQ_BWD;
    for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        for (int64_t m0 = m_begin; m0 < q_len; m0 += AT_BQ_BWD) {
            __syncthreads();  // previous step's tiles are no longer read
            tc_load_rows<D>(qs, q + q_start * s_qt + h * s_qh, s_qt, m0, q_len);
            tc_load_rows<D>(dos, dout + q_start * s_dt + h * s_dh, s_dt, m0, q_len);
            for (int r = threadIdx.x; r < TC_ROWS; r += TC_THREADS) {
                const bool ok = m0 + r < q_len;
                lse_s[r] = ok ? lse[h * s_lh + q_start + m0 + r] : 0.0f;
                delta_s[r] = ok ? delta[h * s_lh + q_start + m0 + r] : 0.0f;
            }
            __syncthreads();
            float st[8][4], dpt[8][4];
            tc_scores<D>(st, dpt, ks + warp * 16 * LD, qs, vs + warp * 16 * LD, dos);
#pragma unroll
            for (int n = 0; n < 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int c = n * 8 + 2 * tq + e % 2;
                    const int64_t kk = key[e / 2];
                    const bool vis = kk < k_len && m0 + c < q_len && kk <= offset + m0 + c;
                    const float p = vis ? expf(st[n][e] * scale - lse_s[c]) : 0.0f;
                    dpt[n][e] = vis ? p * (dpt[n][e] - delta_s[c]) : 0.0f;  // dS^T
                    st[n][e] = p;                                             // P^T
                }
            uint32_t pa[4][4], da[4][4];
            tc_to_a(pa, st);
            tc_to_a(da, dpt);
            // Every query of the step sees every key of the block (and all are real): no masked term.
            const bool whole = m0 + AT_BQ_BWD <= q_len && kv0 + AT_BKV - 1 <= offset + m0;
            if (!whole) {
                __syncthreads();  // every warp has read this step's q and dO for S and dP
                for (int d = threadIdx.x; d < D; d += TC_THREADS) {
                    int lq = -1;
                    int ld = -1;
                    for (int i = 0; i < TC_ROWS; ++i) {
                        if (!finite(f32(qs[i * LD + d]))) {
                            lq = i;
                            qs[i * LD + d] = to_bf16(0.0f);
                        }
                        if (!finite(f32(dos[i * LD + d]))) {
                            ld = i;
                            dos[i * LD + d] = to_bf16(0.0f);
                        }
                    }
                    last_bad_q[d] = lq;
                    last_bad_do[d] = ld;
                }
                __syncthreads();
            }
            tc_ab<D>(gv, pa, dos);
            tc_ab<D>(gk, da, qs);
            if (!whole) {  // a non-finite q / dO of a query that sees the key reaches its output elements
#pragma unroll
                for (int n = 0; n < NT; ++n)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int d = n * 8 + 2 * tq + e % 2;
                        const int64_t kk = key[e / 2];
                        const int lq = last_bad_q[d];
                        const int ld = last_bad_do[d];
                        if (kk < k_len && lq >= 0 && kk <= offset + m0 + lq) gk[n][e] = NAN;
                        if (kk < k_len && ld >= 0 && kk <= offset + m0 + ld) gv[n][e] = NAN;
                    }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (key[i] >= k_len) continue;
        bf16* dkr = dk + (k_start + key[i]) * s_dkt + kvh * s_dkh;
        bf16* dvr = dv + (k_start + key[i]) * s_dvt + kvh * s_dvh;
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                dkr[n * 8 + 2 * tq + c] = to_bf16(gk[n][2 * i + c] * scale);
                dvr[n * 8 + 2 * tq + c] = to_bf16(gv[n][2 * i + c]);
            }
    }
}

// Both backward kernels of one form (TC: the tensor-core kernels, TC_THREADS each; else the FMA
// kernels, AT_THREADS), dK / dV first.
template <int D, bool TC>
int launch_bwd(const void* q, const void* k, const void* v, const void* dout, const void* lse, const void* delta,
               void* dq, void* dk, void* dv, const void* cu_q, const void* cu_k, int64_t batch, int64_t n_mblocks,
               int64_t n_nblocks, int64_t heads, int64_t kv_heads, int64_t group, int64_t s_qt, int64_t s_qh,
               int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_dt, int64_t s_dh, int64_t s_lh,
               int64_t s_gqt, int64_t s_gqh, int64_t s_gkt, int64_t s_gkh, int64_t s_gvt, int64_t s_gvh, float scale,
               cudaStream_t st) {
    constexpr int threads = TC ? TC_THREADS : AT_THREADS;
    if (n_nblocks > 0) {
        auto kernel = [] {
            if constexpr (TC) return attn_bwd_dkdv_tc_kernel<D>;
            else return attn_bwd_dkdv_kernel<D>;
        }();
        constexpr size_t smem = TC ? dkdv_tc_smem<D>() : dkdv_smem<D>();
        if (int e = prepare(kernel, smem)) return e;
        dim3 grid(static_cast<unsigned>(batch * n_nblocks), static_cast<unsigned>(kv_heads));
        kernel<<<grid, threads, smem, st>>>(
            static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
            static_cast<const bf16*>(dout), static_cast<const float*>(lse), static_cast<const float*>(delta),
            static_cast<bf16*>(dk), static_cast<bf16*>(dv), static_cast<const int32_t*>(cu_q),
            static_cast<const int32_t*>(cu_k), n_nblocks, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_dt, s_dh, s_lh,
            s_gkt, s_gkh, s_gvt, s_gvh, scale);
        if (int e = launch_status()) return e;
    }
    if (n_mblocks > 0) {
        auto kernel = [] {
            if constexpr (TC) return attn_bwd_dq_tc_kernel<D>;
            else return attn_bwd_dq_kernel<D>;
        }();
        constexpr size_t smem = TC ? dq_tc_smem<D>() : dq_smem<D>();
        if (int e = prepare(kernel, smem)) return e;
        dim3 grid(static_cast<unsigned>(batch * n_mblocks), static_cast<unsigned>(heads));
        kernel<<<grid, threads, smem, st>>>(
            static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
            static_cast<const bf16*>(dout), static_cast<const float*>(lse), static_cast<const float*>(delta),
            static_cast<bf16*>(dq), static_cast<const int32_t*>(cu_q), static_cast<const int32_t*>(cu_k), n_mblocks, group,
            s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_dt, s_dh, s_lh, s_gqt, s_gqh, scale);
        if (int e = launch_status()) return e;
    }
    return 0;
}

int g_attn_bwd_form = 2;  // the declared form (contract ws1-c1-v8); 1, tensor cores (ws1-c1-v7): 41 against 539 ms of FMA chains in a Qwen3-8B train step on the H200
}  // namespace

namespace rl {
namespace attn {
bool bwd_uses_declared(int64_t head_dim) { return g_attn_bwd_form == 2 && (head_dim == 64 || head_dim == 128); }
}  // namespace attn
}  // namespace rl

// delta [H, Tq] (row stride s_lh) = rowsum(dO * O).
RL_EXPORT int rl_attention_bwd_delta(const void* o, const void* dout, void* delta, int64_t tq, int64_t heads, int64_t head_dim, int64_t s_ot, int64_t s_oh, int64_t s_dt, int64_t s_dh, int64_t s_lh, void* stream) {
    if (tq == 0 || heads == 0) return 0;
    if (bwd_uses_declared(head_dim))
        return launch_delta_declared(o, dout, delta, tq, heads, head_dim, s_ot, s_oh, s_dt, s_dh, s_lh, static_cast<cudaStream_t>(stream));
    const int64_t blocks = cdiv(tq * heads, AT_THREADS / 32);
    if (blocks >= 2147483647LL) return static_cast<int>(cudaErrorInvalidValue);
    attn_delta_kernel<<<static_cast<unsigned>(blocks), AT_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(o), static_cast<const bf16*>(dout), static_cast<float*>(delta), tq, heads, head_dim,
        s_ot, s_oh, s_dt, s_dh, s_lh);
    return launch_status();
}

// dq [Tq, H, D], dk / dv [Tk, Hkv, D] (bf16, every row written). n_mblocks = ceil(max Lq / 64),
// n_nblocks = ceil(max Lk / 64).
RL_EXPORT int rl_attention_bwd(const void* q, const void* k, const void* v, const void* dout, const void* lse, const void* delta, void* dq, void* dk, void* dv, const void* cu_q, const void* cu_k, int64_t batch, int64_t n_mblocks, int64_t n_nblocks, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_dt, int64_t s_dh, int64_t s_lh, int64_t s_gqt, int64_t s_gqh, int64_t s_gkt, int64_t s_gkh, int64_t s_gvt, int64_t s_gvh, float scale, void* stream) {
    if (batch == 0 || heads == 0) return 0;
    if (kv_heads <= 0 || heads % kv_heads || !grid_fits(batch * n_mblocks, heads) || !grid_fits(batch * n_nblocks, kv_heads))
        return static_cast<int>(cudaErrorInvalidValue);
    const int64_t group = heads / kv_heads;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (bwd_uses_declared(head_dim))
        return launch_bwd_declared(q, k, v, dout, lse, delta, dq, dk, dv, cu_q, cu_k, batch, n_mblocks, n_nblocks, heads, kv_heads, group, head_dim, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_dt, s_dh, s_lh, s_gqt, s_gqh, s_gkt, s_gkh, s_gvt, s_gvh, scale, st);
    if (g_attn_bwd_form >= 1 && AT_BKV == TC_ROWS && AT_BQ_BWD == TC_ROWS) {
#define RL_ATT_BWD_TC(DD) \
    launch_bwd<DD, true>(q, k, v, dout, lse, delta, dq, dk, dv, cu_q, cu_k, batch, n_mblocks, n_nblocks, heads, kv_heads, \
                         group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_dt, s_dh, s_lh, s_gqt, s_gqh, s_gkt, s_gkh, s_gvt, \
                         s_gvh, scale, st)
        switch (head_dim) {
            case 16: return RL_ATT_BWD_TC(16);
            case 32: return RL_ATT_BWD_TC(32);
            case 64: return RL_ATT_BWD_TC(64);
            case 128: return RL_ATT_BWD_TC(128);
            default: break;  // D = 256: form 0 (the accumulators would not fit in registers)
        }
#undef RL_ATT_BWD_TC
    }
#define RL_ATT_BWD(DD) \
    launch_bwd<DD, false>(q, k, v, dout, lse, delta, dq, dk, dv, cu_q, cu_k, batch, n_mblocks, n_nblocks, heads, kv_heads, group, \
                   s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_dt, s_dh, s_lh, s_gqt, s_gqh, s_gkt, s_gkh, s_gvt, s_gvh, scale, st)
    switch (head_dim) {
        case 16: return RL_ATT_BWD(16);
        case 32: return RL_ATT_BWD(32);
        case 64: return RL_ATT_BWD(64);
        case 128: return RL_ATT_BWD(128);
        case 256: return RL_ATT_BWD(256);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
#undef RL_ATT_BWD
}

// The backward's form for the process (see the top of this file): 0 = FMA chains on CUDA cores,
// 1 = tensor cores (head dims 16 to 128; D = 256 runs form 0), 2, the default since ws1-c1-v8 = the declared form of
// attention_tc.cu, the Triton backend's backward sequence (head dims 64 and 128; others run form 1's
// rule). Returns the previous form, or -1 (and changes nothing) for another number.
RL_EXPORT int64_t rl_attention_bwd_form(int64_t form) {
    if (form < 0 || form > 2) return -1;
    const int64_t old = g_attn_bwd_form;
    g_attn_bwd_form = static_cast<int>(form);
    return old;
}
