// Causal varlen GQA attention of the cuda_bf16 backend: forward (prefill / teacher forcing /
// chunked prefill) and one decode step against a KV cache (this file), and a deterministic
// backward (attention_bwd.cu; shared helpers in attention.cuh).
//
// Arithmetic (CUDA cores, FP32; the library is built with -fmad=false, FMAs are explicit):
//   * score s = (sum_d q[d] * k[d]) * scale: an FMA chain over d = 0 .. D-1 in order, then one
//     FP32 multiply; keys past a row's causal limit get -inf;
//   * the keys are visited in fixed blocks of AT_BKV = 64, [0, 64), [64, 128), ... of the row's
//     sequence, in increasing order, in every path. Per block and row, with the block's scores:
//       m_new = max(m, max_j s_j);  ref = (m_new == -inf) ? 0 : m_new;
//       alpha = (m_new == m) ? 1 : exp(m - ref);  p_j = exp(s_j - ref)   (FP32, not rounded)
//       l = l * alpha + rowsum(p)     (rowsum: 4 keys per lane summed as (p0 + p1) + (p2 + p3),
//                                      then a fixed 16-lane butterfly)
//       o_d = o_d * alpha, then o_d = fma(p_j, v_j[d], o_d) for j in block order;
//   * out = o / l (IEEE division) rounded once to BF16; a row with no visible key (l == 0) is
//     exactly 0 (pitfall P10); lse = m + log(l) is kept (FP32, [H, Tq]) for the backward.
// A block that lies wholly past a row's causal limit leaves that row's state unchanged (its max
// is -inf, alpha is exactly 1, every p is 0), so a row's bits do not depend on which other rows
// share its tile. The prefill kernel (64 query rows of one head per block) runs forward_rows; a
// decode step (two launches, or the one-pass kernel, below) computes the same scores, block maxima,
// exponentials, sums and FMA chains for its one query row per head in the same order, so a query's
// output is bitwise the same in a full prefill, a chunk, or a decode step. No sum is split over the
// KV axis.
//
// Backward (FlashAttention-2 structure, deterministic, no atomics):
//   delta = sum_d dO * O (one warp per row and head, fixed butterfly);
//   dQ kernel: one block per 64 queries of one head, KV blocks in increasing order:
//     p = exp(s - lse), dp = dO . v, ds = p * (dp - delta), dq_d = fma(ds_j, k_j[d], dq_d) in key
//     order; dq = dq * scale, rounded once;
//   dK/dV kernel: one block per 64 keys of one KV head; query heads of the group in order, and for
//     each head the queries in increasing order: dv_d = fma(p, dO[d], dv_d), dk_d = fma(ds, q[d],
//     dk_d); dk = dk * scale; each rounded once.
// Masked means absent (docs/declared-semantics.md): in blocks that hold masked entries, a masked
// weight (p or ds = 0) never meets a NaN / inf operand: absent_if_masked() selects a masked
// non-finite v / k / q / dO to 0 (finite values pass unchanged, so finite inputs give the old
// bits); fully visible blocks run the plain loop. A visible score of -inf becomes NaN, and a row
// whose sum l is NaN is written as NaN, not as the no-key 0.
// Every accumulation is a sequential FMA chain per output element, so the bits depend only on the
// ordered set of contributing rows, never on the batch, padding or tiling.
#include "attention.cuh"

using namespace rl;
using namespace rl::attn;

namespace {

// This thread's RPT x AT_CPT scores of a block, unscaled: dots[i][jj] = q[rg + 16 i] . k[cs + 16 jj],
// each the FMA chain over d = 0 .. D-1 in order that dot_row computes (the same bits), with the
// RPT query pairs and AT_CPT key pairs of a d step loaded once for all of them (a register tile:
// a quarter of dot_row's shared-memory loads per FMA).
template <int D, int RPT>
__device__ __forceinline__ void dot_block(float (&dots)[RPT][AT_CPT], const bf16* qs, const bf16* ks, int rg, int cs) {
    constexpr int LD = Ld<D>::value;
#pragma unroll
    for (int i = 0; i < RPT; ++i)
#pragma unroll
        for (int jj = 0; jj < AT_CPT; ++jj) dots[i][jj] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d += 2) {
        float2 qv[RPT], kv[AT_CPT];
#pragma unroll
        for (int i = 0; i < RPT; ++i)
            qv[i] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(qs + (rg + AT_GROUPS * i) * LD + d));
#pragma unroll
        for (int jj = 0; jj < AT_CPT; ++jj)
            kv[jj] = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(ks + (cs + AT_LANES * jj) * LD + d));
#pragma unroll
        for (int i = 0; i < RPT; ++i)
#pragma unroll
            for (int jj = 0; jj < AT_CPT; ++jj) {
                dots[i][jj] = __fmaf_rn(qv[i].x, kv[jj].x, dots[i][jj]);
                dots[i][jj] = __fmaf_rn(qv[i].y, kv[jj].y, dots[i][jj]);
            }
    }
}

// The per-row online-softmax forward over KV blocks [0, n_stop) (see the file comment).
// qs: this block's query tile in shared memory ([16 * RPT][D + 2]); row rg + 16 i is this
// thread's row i, with causal limit lim[i] (-1 for a padding row). ks / vs / ps: scratch.
// The decode launches (below) compute the same function for one row with another work split.
template <int D, int RPT>
__device__ __forceinline__ void forward_rows(const bf16* qs, bf16* ks, bf16* vs, float* ps, const bf16* k_base,
                                             const bf16* v_base, int64_t s_kt, int64_t s_vt, int64_t kv_len,
                                             int64_t n_stop, const int64_t (&lim)[RPT], float scale,
                                             float (&o)[RPT][D / AT_LANES], float (&m)[RPT], float (&l)[RPT]) {
    constexpr int LD = Ld<D>::value;
    constexpr int DPT = D / AT_LANES;
    const int rg = threadIdx.x / AT_LANES;
    const int cs = threadIdx.x % AT_LANES;
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
#pragma unroll
        for (int dj = 0; dj < DPT; ++dj) o[i][dj] = 0.0f;
    }
    for (int64_t kv0 = 0; kv0 < n_stop; kv0 += AT_BKV) {
        __syncthreads();  // the previous block's ks / vs / ps are no longer read
        load_rows<D, AT_BKV>(ks, k_base, s_kt, kv0, kv_len);
        load_rows<D, AT_BKV>(vs, v_base, s_vt, kv0, kv_len);
        __syncthreads();
        float dots[RPT][AT_CPT];
        dot_block<D, RPT>(dots, qs, ks, rg, cs);
        float alpha[RPT];
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const int r = rg + AT_GROUPS * i;
            float s[AT_CPT];
#pragma unroll
            for (int jj = 0; jj < AT_CPT; ++jj) {
                const int c = cs + AT_LANES * jj;
                s[jj] = visible_score(dots[i][jj] * scale, kv0 + c <= lim[i]);
            }
            float bm = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
            bm = half_warp_max(bm);
            const float m_new = fmaxf(m[i], bm);
            const float ref = (m_new == -INFINITY) ? 0.0f : m_new;
            alpha[i] = (m_new == m[i]) ? 1.0f : expf(m[i] - ref);
            float p[AT_CPT];
#pragma unroll
            for (int jj = 0; jj < AT_CPT; ++jj) p[jj] = expf(s[jj] - ref);
            float psum = (p[0] + p[1]) + (p[2] + p[3]);
            psum = half_warp_sum(psum);
            l[i] = l[i] * alpha[i] + psum;
            m[i] = m_new;
#pragma unroll
            for (int jj = 0; jj < AT_CPT; ++jj) ps[r * AT_PS_LD + cs + AT_LANES * jj] = p[jj];
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const int r = rg + AT_GROUPS * i;
#pragma unroll
            for (int dj = 0; dj < DPT; ++dj) o[i][dj] = o[i][dj] * alpha[i];
            if (kv0 + AT_BKV - 1 <= lim[i]) {  // the row sees the whole block
                for (int j = 0; j < AT_BKV; ++j) {
                    const float pj = ps[r * AT_PS_LD + j];
                    const bf16* vr = vs + j * LD + cs;
#pragma unroll
                    for (int dj = 0; dj < DPT; ++dj) o[i][dj] = __fmaf_rn(pj, f32(vr[AT_LANES * dj]), o[i][dj]);
                }
            } else {  // masked keys (p = 0): their values are absent, not 0 * v
                for (int j = 0; j < AT_BKV; ++j) {
                    const float pj = ps[r * AT_PS_LD + j];
                    const bool vis = kv0 + j <= lim[i];
                    const bf16* vr = vs + j * LD + cs;
#pragma unroll
                    for (int dj = 0; dj < DPT; ++dj)
                        o[i][dj] = __fmaf_rn(pj, absent_if_masked(f32(vr[AT_LANES * dj]), vis), o[i][dj]);
                }
            }
        }
    }
}

template <int D, int RPT>
constexpr size_t forward_smem() {
    return static_cast<size_t>(AT_GROUPS * RPT + 2 * AT_BKV) * Ld<D>::value * sizeof(bf16) +
           static_cast<size_t>(AT_GROUPS * RPT) * AT_PS_LD * sizeof(float);
}

// Varlen prefill: block (b * n_mblocks + qblock, h) owns queries [q0, q0 + 64) of sequence b, head h.
template <int D>
__global__ void __launch_bounds__(AT_THREADS)
attn_fwd_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, bf16* __restrict__ out,
                float* __restrict__ lse, const int32_t* __restrict__ cu_q, const int32_t* __restrict__ cu_k,
                int64_t n_mblocks, int64_t group, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt,
                int64_t s_vh, int64_t s_ot, int64_t s_oh, int64_t s_lh, float scale) {
    constexpr int RPT = AT_RPT_PREFILL;
    constexpr int BQ = AT_GROUPS * RPT;
    constexpr int LD = Ld<D>::value;
    constexpr int DPT = D / AT_LANES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* ks = qs + BQ * LD;
    bf16* vs = ks + AT_BKV * LD;
    float* ps = reinterpret_cast<float*>(vs + AT_BKV * LD);

    const int64_t b = blockIdx.x / n_mblocks;
    const int64_t q0 = (blockIdx.x % n_mblocks) * BQ;
    const int64_t h = blockIdx.y;
    const int64_t q_start = cu_q[b];
    const int64_t q_len = static_cast<int64_t>(cu_q[b + 1]) - q_start;
    if (q0 >= q_len) return;  // uniform over the block
    const int64_t k_start = cu_k[b];
    const int64_t k_len = static_cast<int64_t>(cu_k[b + 1]) - k_start;
    const int64_t kvh = h / group;
    const int rg = threadIdx.x / AT_LANES;
    const int cs = threadIdx.x % AT_LANES;

    load_rows<D, BQ>(qs, q + q_start * s_qt + h * s_qh, s_qt, q0, q_len);
    int64_t lim[RPT];
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        const int64_t qi = q0 + rg + AT_GROUPS * i;
        lim[i] = (qi < q_len) ? (k_len - q_len + qi) : -1;
    }
    const int64_t n_stop = (k_len - q_len + q0 + BQ) < k_len ? (k_len - q_len + q0 + BQ) : k_len;
    float o[RPT][DPT], m[RPT], l[RPT];
    forward_rows<D, RPT>(qs, ks, vs, ps, k + k_start * s_kt + kvh * s_kh, v + k_start * s_vt + kvh * s_vh, s_kt, s_vt,
                         k_len, n_stop, lim, scale, o, m, l);
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        const int64_t qi = q0 + rg + AT_GROUPS * i;
        if (qi >= q_len) continue;
        const bool has = l[i] != 0.0f;  // 0: no visible key (exact 0); NaN: a visible non-finite value
        bf16* orow = out + (q_start + qi) * s_ot + h * s_oh;
#pragma unroll
        for (int dj = 0; dj < DPT; ++dj) orow[cs + AT_LANES * dj] = to_bf16(has ? o[i][dj] / l[i] : 0.0f);
        if (cs == 0) lse[h * s_lh + q_start + qi] = has ? m[i] + logf(l[i]) : 0.0f;
    }
}

template <int D>
int launch_fwd(const void* q, const void* k, const void* v, void* out, void* lse, const void* cu_q, const void* cu_k,
               int64_t batch, int64_t n_mblocks, int64_t heads, int64_t group, int64_t s_qt, int64_t s_qh,
               int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_ot, int64_t s_oh, int64_t s_lh,
               float scale, cudaStream_t st) {
    constexpr size_t smem = forward_smem<D, AT_RPT_PREFILL>();
    if (int e = prepare(attn_fwd_kernel<D>, smem)) return e;
    dim3 grid(static_cast<unsigned>(batch * n_mblocks), static_cast<unsigned>(heads));
    attn_fwd_kernel<D><<<grid, AT_THREADS, smem, st>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v), static_cast<bf16*>(out),
        static_cast<float*>(lse), static_cast<const int32_t*>(cu_q), static_cast<const int32_t*>(cu_k), n_mblocks,
        group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale);
    return launch_status();
}

// ------------------------------------------------------------------------------------- decode
// One decode step runs in two launches that together compute exactly forward_rows for each query
// head (the same scores, block maxima, exponentials, sums and FMA chains, in the same order), so
// a decode row stays bitwise the prefill row of the same query (tested):
//   1. scores: block (b, KV head x head block, 128-key chunk); thread t owns key kv0 + t and runs
//      the DC_HEADS dot products of that key (dot_row's FMA chain over d in order, interleaved),
//      then s = visible_score(dot * scale); keys at or past the length get -inf, as a masked key
//      does in forward_rows. The scores go (FP32) to the scratch sc [B, H, S_cap]. Each key row
//      is read from shared memory once, by one thread, in 16-byte loads.
//   2. softmax and P V: block (b, KV head x head block x column slice) walks the 64-key blocks in
//      increasing order. Two "stats" warps (16 lanes per head, the lane layout of forward_rows:
//      lane cs holds keys cs + 16 jj) compute the block max, alpha, p and the 16-lane sum l for
//      block k + 1 while the P V threads run block k's FMA chains o = o * alpha, then
//      o = fma(p_j, v_j, o) for j in order. Scores and V arrive through cp.async rings several
//      blocks ahead. The column slice (d_split, 1 .. 8) only decides which output columns a
//      block owns: each column's chain is the same, so the bits do not depend on it.
constexpr int DC_HEADS = 4;                           // query heads per block, both launches
constexpr int DC_SKEYS = 128;                         // keys (threads) per block of launch 1
constexpr int DC_SSTAGES = 8;                         // score blocks in flight (launch 2)
constexpr int DC_STAT_THREADS = DC_HEADS * AT_LANES;  // 64: two warps, one half-warp per head
static_assert(DC_STAT_THREADS == 64 && AT_BKV == 4 * AT_LANES, "one 16-byte score copy per stats lane");

// Rows [row0, row0 + R) x columns [0, W) of a row-major BF16 source (row stride s, unit column
// stride) into shared rows of LDS elements, by NT threads; rows at or past n are zero-filled. VEC:
// 16-byte cp.async (16-byte aligned rows); otherwise 2-byte copies. Either way a later
// cp_async_wait + __syncthreads makes the tile visible.
template <int W, int R, int LDS, int NT>
__device__ __forceinline__ void dc_issue_rows(bf16* dst, const bf16* src, int64_t s, int64_t row0, int64_t n, int t,
                                              bool vec) {
    if (vec) {
        constexpr int VPR = W / 8;
        for (int e = t; e < R * VPR; e += NT) {
            const int r = e / VPR;
            const int cc = (e % VPR) * 8;
            const bool ok = row0 + r < n;
            cp_async16(dst + r * LDS + cc, ok ? src + (row0 + r) * s + cc : src, ok ? 16 : 0);
        }
    } else {
        for (int e = t; e < R * W; e += NT) {
            const int r = e / W;
            const int cc = e % W;
            dst[r * LDS + cc] = row0 + r < n ? src[(row0 + r) * s + cc] : to_bf16(0.0f);
        }
    }
}

// The NH score dot products of one key row kr (shared memory, 16-byte aligned) with NH query heads:
// dot_row's FMA chain over d in increasing order for each head (the heads interleaved), q from qf
// ([NH][D] FP32, exact). acc starts at 0.
template <int D, int NH>
__device__ __forceinline__ void dc_dots(const bf16* kr, const float* qf, float (&acc)[NH]) {
#pragma unroll 4
    for (int d = 0; d < D; d += 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(kr + d);
        const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&raw);
        float kf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __bfloat1622float2(k2[i]);
            kf[2 * i] = f.x;
            kf[2 * i + 1] = f.y;
        }
#pragma unroll
        for (int h = 0; h < NH; ++h) {
            const float4 qa = *reinterpret_cast<const float4*>(qf + h * D + d);
            const float4 qb = *reinterpret_cast<const float4*>(qf + h * D + d + 4);
            acc[h] = __fmaf_rn(qa.x, kf[0], acc[h]);
            acc[h] = __fmaf_rn(qa.y, kf[1], acc[h]);
            acc[h] = __fmaf_rn(qa.z, kf[2], acc[h]);
            acc[h] = __fmaf_rn(qa.w, kf[3], acc[h]);
            acc[h] = __fmaf_rn(qb.x, kf[4], acc[h]);
            acc[h] = __fmaf_rn(qb.y, kf[5], acc[h]);
            acc[h] = __fmaf_rn(qb.z, kf[6], acc[h]);
            acc[h] = __fmaf_rn(qb.w, kf[7], acc[h]);
        }
    }
}

// forward_rows' per-block softmax step for one head, run by a half-warp (lane cs holds keys
// cs + 16 jj of the block): sb holds the block's 64 scores of the head (read only when head; a
// head past the group takes -inf). Updates m and l, writes p to pb[0 .. 64) and, from lane 0,
// alpha to *alpha_out.
__device__ __forceinline__ void dc_softmax_block(const float* sb, bool head, int cs, float& m, float& l, float* pb,
                                                 float* alpha_out) {
    float s[AT_CPT];
#pragma unroll
    for (int jj = 0; jj < AT_CPT; ++jj) s[jj] = head ? sb[cs + AT_LANES * jj] : -INFINITY;
    float bm = fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3]));
    bm = half_warp_max(bm);
    const float m_new = fmaxf(m, bm);
    const float ref = (m_new == -INFINITY) ? 0.0f : m_new;
    const float alpha = (m_new == m) ? 1.0f : expf(m - ref);
    float p[AT_CPT];
#pragma unroll
    for (int jj = 0; jj < AT_CPT; ++jj) p[jj] = expf(s[jj] - ref);
    float psum = (p[0] + p[1]) + (p[2] + p[3]);
    psum = half_warp_sum(psum);
    l = l * alpha + psum;
    m = m_new;
#pragma unroll
    for (int jj = 0; jj < AT_CPT; ++jj) pb[cs + AT_LANES * jj] = p[jj];
    if (cs == 0) *alpha_out = alpha;
}

// One 64-key block of one thread's P V chains: CPT (1 or 2) adjacent output columns of one head,
// o = o * a, then o = fma(p_j, v_j, o) for j in block order. pb: the head's 64 p values (16-byte
// aligned); vt: the thread's first column in the block's V tile (row stride LDV); kv0: the
// block's first key; n: the row's key count (keys >= n are masked: their values are absent).
template <int CPT, int LDV>
__device__ __forceinline__ void dc_pv_block(float& o0, float& o1, float a, const float* pb, const bf16* vt,
                                            int64_t kv0, int64_t n) {
    o0 = o0 * a;
    o1 = o1 * a;
    if (kv0 + AT_BKV - 1 <= n - 1) {  // the row sees the whole block
        const float4* pb4 = reinterpret_cast<const float4*>(pb);
#pragma unroll 4
        for (int j4 = 0; j4 < AT_BKV / 4; ++j4) {
            const float4 p4 = pb4[j4];
            const float pj[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                if constexpr (CPT == 2) {
                    const float2 v2 =
                        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vt + (4 * j4 + i) * LDV));
                    o0 = __fmaf_rn(pj[i], v2.x, o0);
                    o1 = __fmaf_rn(pj[i], v2.y, o1);
                } else {
                    o0 = __fmaf_rn(pj[i], f32(vt[(4 * j4 + i) * LDV]), o0);
                }
            }
        }
    } else {  // masked keys (p = 0): their values are absent, not 0 * v
        for (int j = 0; j < AT_BKV; ++j) {
            const float pj = pb[j];
            const bool vis = kv0 + j <= n - 1;
            if constexpr (CPT == 2) {
                const float2 v2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vt + j * LDV));
                o0 = __fmaf_rn(pj, absent_if_masked(v2.x, vis), o0);
                o1 = __fmaf_rn(pj, absent_if_masked(v2.y, vis), o1);
            } else {
                o0 = __fmaf_rn(pj, absent_if_masked(f32(vt[j * LDV]), vis), o0);
            }
        }
    }
}

// dc_pv_block for two heads at once (the one-pass form): o[h][c] for heads h = 0, 1 (p values pb0,
// pb1; rescale a0, a1) and columns c = 0, 1 of one V pair; each chain is dc_pv_block's, one V load
// serves four of them.
template <int LDV>
__device__ __forceinline__ void dc_pv_block_2h(float (&o)[2][2], float a0, float a1, const float* pb0,
                                               const float* pb1, const bf16* vt, int64_t kv0, int64_t n) {
    o[0][0] = o[0][0] * a0;
    o[0][1] = o[0][1] * a0;
    o[1][0] = o[1][0] * a1;
    o[1][1] = o[1][1] * a1;
    if (kv0 + AT_BKV - 1 <= n - 1) {  // the row sees the whole block
        const float4* p0 = reinterpret_cast<const float4*>(pb0);
        const float4* p1 = reinterpret_cast<const float4*>(pb1);
#pragma unroll 4
        for (int j4 = 0; j4 < AT_BKV / 4; ++j4) {
            const float4 x = p0[j4];
            const float4 y = p1[j4];
            const float q0[4] = {x.x, x.y, x.z, x.w};
            const float q1[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float2 v2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vt + (4 * j4 + i) * LDV));
                o[0][0] = __fmaf_rn(q0[i], v2.x, o[0][0]);
                o[0][1] = __fmaf_rn(q0[i], v2.y, o[0][1]);
                o[1][0] = __fmaf_rn(q1[i], v2.x, o[1][0]);
                o[1][1] = __fmaf_rn(q1[i], v2.y, o[1][1]);
            }
        }
    } else {  // masked keys (p = 0): their values are absent, not 0 * v
        for (int j = 0; j < AT_BKV; ++j) {
            const bool vis = kv0 + j <= n - 1;
            const float2 v2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vt + j * LDV));
            const float vx = absent_if_masked(v2.x, vis);
            const float vy = absent_if_masked(v2.y, vis);
            o[0][0] = __fmaf_rn(pb0[j], vx, o[0][0]);
            o[0][1] = __fmaf_rn(pb0[j], vy, o[0][1]);
            o[1][0] = __fmaf_rn(pb1[j], vx, o[1][0]);
            o[1][1] = __fmaf_rn(pb1[j], vy, o[1][1]);
        }
    }
}

template <int D>
struct DecodeScores {
    static constexpr int LDK = D + 8;  // 16-byte aligned rows; 8 rows of one load phase hit distinct banks
    static constexpr size_t SMEM = static_cast<size_t>(DC_SKEYS) * LDK * sizeof(bf16) +
                                   static_cast<size_t>(DC_HEADS) * D * sizeof(float);
};

template <int D>
__global__ void __launch_bounds__(DC_SKEYS)
attn_decode_scores_kernel(const bf16* __restrict__ q, const bf16* __restrict__ kc, const int32_t* __restrict__ seqlens,
                          float* __restrict__ sc, int64_t group, int64_t n_hb, int64_t s_qb, int64_t s_qh,
                          int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_sb, int64_t s_sh, float scale, int vec) {
    constexpr int LDK = DecodeScores<D>::LDK;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* ks = reinterpret_cast<bf16*>(smem_raw);                  // [DC_SKEYS][LDK]
    float* qf = reinterpret_cast<float*>(ks + DC_SKEYS * LDK);     // [DC_HEADS][D], FP32 (exact)
    const int64_t b = blockIdx.x;
    const int64_t kvh = blockIdx.y / n_hb;
    const int64_t g0 = static_cast<int64_t>(blockIdx.y % n_hb) * DC_HEADS;
    const int64_t kv0 = static_cast<int64_t>(blockIdx.z) * DC_SKEYS;
    pdl_wait();  // launched through launch_pdl: q and the cache's new row come from the kernel before
    pdl_launch_dependents();
    const int64_t n = seqlens[b];
    if (kv0 >= n) return;  // uniform over the block; launch 2 reads no score of this chunk
    const int t = threadIdx.x;
    dc_issue_rows<D, DC_SKEYS, LDK, DC_SKEYS>(ks, kc + b * s_kb + kvh * s_kh, s_kt, kv0, n, t, vec);
    cp_async_commit();
    for (int e = t; e < DC_HEADS * D; e += DC_SKEYS) {
        const int64_t g = g0 + e / D;
        qf[e] = g < group ? f32(q[b * s_qb + (kvh * group + g) * s_qh + e % D]) : 0.0f;
    }
    cp_async_wait<0>();
    __syncthreads();
    const int64_t key = kv0 + t;
    if (key >= s_sh) return;
    float acc[DC_HEADS];
#pragma unroll
    for (int h = 0; h < DC_HEADS; ++h) acc[h] = 0.0f;
    const bool vis = key < n;  // forward_rows: key <= lim = n - 1
    if (vis) dc_dots<D, DC_HEADS>(ks + t * LDK, qf, acc);
#pragma unroll
    for (int h = 0; h < DC_HEADS; ++h) {
        if (g0 + h < group)
            sc[b * s_sb + (kvh * group + g0 + h) * s_sh + key] = vis ? visible_score(acc[h] * scale, true) : -INFINITY;
    }
}

template <int D, int DSPLIT>
struct DecodePv {
    static constexpr int DV = D / DSPLIT;                 // output columns per block
    // Columns per P V thread: one at the small-batch splits (4 and 8, latency-bound walks: half the
    // instructions per thread per key block), else a pair. Each column's chain is the same either way.
    static constexpr int CPT = DSPLIT >= 4 ? 1 : 2;
    static constexpr int NPV = DC_HEADS * DV / CPT;       // P V threads: CPT columns of one head each
    static constexpr int THREADS = DC_STAT_THREADS + NPV;
    static constexpr int LDV = DV + 8;
    static constexpr int TILE = AT_BKV * LDV;             // elements of one V tile
    static constexpr int STAGES = DV >= 128 ? 3 : (DV >= 64 ? 5 : 8);  // about 50 KB of V in flight at most
    static constexpr int SCORES = DC_HEADS * AT_BKV;      // floats of one score block
    static constexpr size_t SMEM = static_cast<size_t>(STAGES) * TILE * sizeof(bf16) +
                                   static_cast<size_t>(DC_SSTAGES * SCORES + 2 * DC_HEADS * AT_BKV + 2 * DC_HEADS +
                                                       DC_HEADS) * sizeof(float);
    static_assert(DV >= 16 && DV % 8 == 0, "at least 16 output columns per block");
    static_assert((STAGES * TILE * sizeof(bf16)) % 16 == 0, "the FP32 areas start 16-byte aligned");
};

template <int D, int DSPLIT>
__global__ void __launch_bounds__(DecodePv<D, DSPLIT>::THREADS)
attn_decode_pv_kernel(const float* __restrict__ sc, const bf16* __restrict__ vc, bf16* __restrict__ out,
                      const int32_t* __restrict__ seqlens, int64_t group, int64_t n_hb, int64_t s_sb, int64_t s_sh,
                      int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, int vec) {
    using P = DecodePv<D, DSPLIT>;
    constexpr int DV = P::DV;
    constexpr int LDV = P::LDV;
    constexpr int STAGES = P::STAGES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* ring = reinterpret_cast<bf16*>(smem_raw);                    // [STAGES][64][LDV] V tiles
    float* sring = reinterpret_cast<float*>(ring + STAGES * P::TILE);  // [DC_SSTAGES][DC_HEADS][64] scores
    float* ps = sring + DC_SSTAGES * P::SCORES;                        // [2][DC_HEADS][64] p
    float* al = ps + 2 * DC_HEADS * AT_BKV;                            // [2][DC_HEADS] alpha
    float* lsum = al + 2 * DC_HEADS;                                   // [DC_HEADS] l

    const int64_t b = blockIdx.x;
    const int64_t kvh = blockIdx.y / n_hb;
    const int64_t g0 = static_cast<int64_t>(blockIdx.y % n_hb) * DC_HEADS;
    const int d0 = static_cast<int>(blockIdx.z) * DV;
    const int64_t n = seqlens[b];
    const int64_t nblk = cdiv(n, static_cast<int64_t>(AT_BKV));
    const int tid = threadIdx.x;
    const bool stat = tid < DC_STAT_THREADS;

    // stats threads: head hh = tid / 16, lane cs (forward_rows' row group and lane). Lane cs also
    // copies floats [4 cs, 4 cs + 4) of its head's scores of a block (a half-warp copies one head,
    // and only that half-warp reads them, so a __syncwarp after the wait makes them visible).
    const int hh_s = tid / AT_LANES;
    const int cs = tid % AT_LANES;
    const bool head_s = stat && g0 + hh_s < group;
    const float* srow = sc + b * s_sb + (kvh * group + g0 + (head_s ? hh_s : 0)) * s_sh;
    float m = -INFINITY, l = 0.0f;
    auto issue_scores = [&](int64_t blk) {
        float* dst = sring + (blk % DC_SSTAGES) * P::SCORES + hh_s * AT_BKV + 4 * cs;
        const bool ok = head_s && blk < nblk;
        cp_async16(dst, ok ? srow + blk * AT_BKV + 4 * cs : sc, ok ? 16 : 0);
    };
    // forward_rows' per-block softmax step for one head, on the scores of block blk
    auto stats_step = [&](int64_t blk) {
        cp_async_wait<DC_SSTAGES - 2>();
        __syncwarp();  // block blk's scores (this half-warp's copies) are visible; slot blk - 1 is read
        issue_scores(blk + DC_SSTAGES - 1);
        cp_async_commit();
        dc_softmax_block(sring + (blk % DC_SSTAGES) * P::SCORES + hh_s * AT_BKV, head_s, cs, m, l,
                         ps + (blk & 1) * DC_HEADS * AT_BKV + hh_s * AT_BKV, al + (blk & 1) * DC_HEADS + hh_s);
    };

    // P V threads: head hh = t / (DV / CPT), local columns lc .. lc + CPT - 1
    const int t = tid - DC_STAT_THREADS;
    constexpr int CPT = P::CPT;
    const int hh_v = stat ? 0 : t / (DV / CPT);
    const int lc = stat ? 0 : (t % (DV / CPT)) * CPT;
    const bf16* v_base = vc + b * s_vb + kvh * s_vh + d0;
    float o0 = 0.0f, o1 = 0.0f;

    // Launched through launch_pdl right after launch 1 (common.cuh's PDL rules). The V tiles are
    // copied before pdl_wait: the cache rows and seqlens were written before launch 1, and launch 1
    // lets this launch start only after its own pdl_wait, when every kernel before it has completed.
    // The scores (launch 1's output) are read after it.
    if (stat) {
        pdl_wait();
        pdl_launch_dependents();
#pragma unroll
        for (int s = 0; s < DC_SSTAGES - 1; ++s) {
            issue_scores(s);
            cp_async_commit();
        }
        if (nblk > 0) stats_step(0);
    } else {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < nblk)
                dc_issue_rows<DV, AT_BKV, LDV, P::NPV>(ring + s * P::TILE, v_base, s_vt, s * AT_BKV, n, t, vec);
            cp_async_commit();
        }
        pdl_wait();
        pdl_launch_dependents();
    }
    for (int64_t k = 0; k < nblk; ++k) {
        if (!stat) cp_async_wait<STAGES - 2>();
        __syncthreads();  // V tile k and p / alpha of block k are visible; block k - 1's buffers are free
        if (stat) {
            if (k + 1 < nblk) stats_step(k + 1);
            continue;
        }
        const int64_t nxt = k + STAGES - 1;
        if (nxt < nblk)
            dc_issue_rows<DV, AT_BKV, LDV, P::NPV>(ring + (nxt % STAGES) * P::TILE, v_base, s_vt, nxt * AT_BKV, n, t,
                                                   vec);
        cp_async_commit();
        dc_pv_block<CPT, LDV>(o0, o1, al[(k & 1) * DC_HEADS + hh_v], ps + (k & 1) * DC_HEADS * AT_BKV + hh_v * AT_BKV,
                              ring + (k % STAGES) * P::TILE + lc, k * AT_BKV, n);
    }
    cp_async_wait<0>();
    if (stat && cs == 0) lsum[hh_s] = l;
    __syncthreads();
    if (stat || g0 + hh_v >= group) return;
    const float lv = lsum[hh_v];
    const bool has = lv != 0.0f;  // 0: no visible key (exact 0); NaN: a visible non-finite value
    bf16* orow = out + b * s_ob + (kvh * group + g0 + hh_v) * s_oh + d0 + lc;
    orow[0] = to_bf16(has ? o0 / lv : 0.0f);
    if constexpr (CPT == 2) orow[1] = to_bf16(has ? o1 / lv : 0.0f);
}

// One-pass form of a decode step: one launch in which block (b, KV head x head block) does both
// launches' work for its DC_HEADS query heads and all D columns, in three roles of one pipeline:
//   * score warps (2 AT_BKV threads, one key and two heads each): dc_dots for block k + 2 from a K
//     tile in shared memory, then visible_score(dot * scale), or -inf past the length, into a
//     shared-memory score slot: launch 1's values;
//   * stats warps (DC_STAT_THREADS, launch 2's lane layout): dc_softmax_block for block k + 1 from
//     that slot; they also stream the K tiles (a cp.async ring of STAGES blocks);
//   * P V threads (a column pair of two heads each: one V load for four chains): dc_pv_block's
//     chains (dc_pv_block_2h) for block k from a V ring.
// One __syncthreads per step hands each block on from role to role, so every value is computed by
// the same expression in the same order as in the two-launch form: the same bits (tested). What
// changes is where the time goes: K and V stream through one block per (sequence, KV head), with
// no FP32 score scratch in global memory. A speed choice of the launcher (form 0).
// A tile copier of the one-pass form: NT threads copy the 64-row x D tiles of a sequence in order
// (row stride LD in shared memory) with 16-byte cp.async. Thread t always copies the same 16-byte
// column of rows t / (D / 8) + i * RSTEP, so a copy only adds a fixed pointer step: the source
// pointers, shared offset and row strides are worked out once per block. Rows at or past n are
// zero-filled. Needs 16-byte aligned rows (rows_vec16); otherwise dc_issue_rows' 2-byte copies run.
template <int D, int LD, int NT>
struct OnePassCopier {
    static constexpr int VPR = D / 8;            // 16-byte chunks per row
    static constexpr int RSTEP = NT / VPR;       // rows between one thread's copies
    static constexpr int N = AT_BKV / RSTEP;     // copies per thread per tile
    static_assert(NT % VPR == 0 && AT_BKV % RSTEP == 0, "every thread copies whole rows' chunks");
    const bf16* base;
    const bf16* next;  // this thread's first chunk of the next tile
    int64_t stride, rstep;  // row stride; RSTEP rows
    int row;                // the next tile's first row
    int r0, soff;
    bool vec;
    __device__ __forceinline__ void init(const bf16* b, int64_t s, int t, bool v) {
        base = b;
        stride = s;
        rstep = RSTEP * s;
        vec = v;
        row = 0;
        r0 = t / VPR;
        const int cc = (t % VPR) * 8;
        next = b + r0 * s + cc;
        soff = r0 * LD + cc;
    }
    // Copy the next tile (rows [row, row + 64)) into tile.
    __device__ __forceinline__ void issue_next(bf16* tile, int n, int t) {
        if (!vec) {
            dc_issue_rows<D, AT_BKV, LD, NT>(tile, base, stride, row, n, t, false);
        } else {
            const int left = n - row - r0;  // this thread's rows i * RSTEP < left are visible
            const bf16* p = next;
#pragma unroll
            for (int i = 0; i < N; ++i) {
                const bool ok = i * RSTEP < left;
                cp_async16(tile + soff + i * RSTEP * LD, ok ? p : base, ok ? 16 : 0);
                p += rstep;
            }
            next = p;  // N * RSTEP = 64 rows on
        }
        row += AT_BKV;
    }
};

template <int D, int STAGES>
struct DecodeOnePass {
    static constexpr int NSC = 2 * AT_BKV;                    // score threads: one key, two heads each
    static constexpr int NPV = D;                             // P V threads: two heads x two columns each
    static constexpr int THREADS = NSC + DC_STAT_THREADS + NPV;
    static constexpr int LD = D + 8;                          // K and V tile rows (16-byte aligned)
    static constexpr int TILE = AT_BKV * LD;
    static constexpr int SCORES = DC_HEADS * AT_BKV;
    static constexpr size_t SMEM = static_cast<size_t>(2 * STAGES) * TILE * sizeof(bf16) +
                                   static_cast<size_t>(DC_HEADS * D + 4 * SCORES + 3 * DC_HEADS) * sizeof(float);
    // two blocks per SM where their shared memory fits one (the registers are then capped to fit too)
    static constexpr int MIN_BLOCKS = 2 * (SMEM + 1024) <= 227 * 1024 ? 2 : 1;
    static_assert(DC_HEADS == 4, "two head pairs per block");
    static_assert(NSC % 32 == 0 && DC_STAT_THREADS % 32 == 0, "the score and stats roles are whole warps");
    static_assert((2 * STAGES * TILE * sizeof(bf16)) % 16 == 0, "the FP32 areas start 16-byte aligned");
    static_assert(SMEM <= 227 * 1024, "fits an SM");
};

// Ring depths of the one-pass form: shallow where two blocks share an SM, deep where a grid of at
// most DECODE_ONE_PASS_DEEP_MAX_BLOCKS blocks gives each block an SM of its own.
template <int D>
struct OnePassStages {
    static constexpr int SHALLOW = D >= 256 ? 2 : 3;
    static constexpr int DEEP = D >= 256 ? 3 : 6;
};
constexpr int64_t DECODE_ONE_PASS_DEEP_MAX_BLOCKS = 132;  // the H200's SMs
int g_one_pass_stages = 0;  // 0: the library's choice; else SHALLOW or DEEP for every launch (sweep tool)

template <int D, int STAGES>
__global__ void __launch_bounds__(DecodeOnePass<D, STAGES>::THREADS, DecodeOnePass<D, STAGES>::MIN_BLOCKS)
attn_decode_one_pass_kernel(const bf16* __restrict__ q, const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                            bf16* __restrict__ out, const int32_t* __restrict__ seqlens, int64_t group, int64_t n_hb,
                            int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb,
                            int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, int vec_k,
                            int vec_v) {
    using P = DecodeOnePass<D, STAGES>;
    constexpr int LD = P::LD;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* kring = reinterpret_cast<bf16*>(smem_raw);                  // [STAGES][64][LD] K tiles
    bf16* vring = kring + STAGES * P::TILE;                           // [STAGES][64][LD] V tiles
    float* qf = reinterpret_cast<float*>(vring + STAGES * P::TILE);   // [DC_HEADS][D] q (FP32, exact)
    float* sbuf = qf + DC_HEADS * D;                                  // [2][DC_HEADS][64] scores
    float* ps = sbuf + 2 * P::SCORES;                                 // [2][DC_HEADS][64] p
    float* al = ps + 2 * P::SCORES;                                   // [2][DC_HEADS] alpha
    float* lsum = al + 2 * DC_HEADS;                                  // [DC_HEADS] l

    const int64_t b = blockIdx.x;
    const int64_t kvh = blockIdx.y / n_hb;
    const int64_t g0 = static_cast<int64_t>(blockIdx.y % n_hb) * DC_HEADS;
    const int tid = threadIdx.x;
    enum { SCORE, STAT, PV };
    const int role = tid < P::NSC ? SCORE : (tid < P::NSC + DC_STAT_THREADS ? STAT : PV);
    pdl_wait();  // q and the cache's new row come from the kernels before
    pdl_launch_dependents();
    const int64_t n = seqlens[b];
    const int64_t nblk = cdiv(n, static_cast<int64_t>(AT_BKV));

    // scores: key key_s of a block, heads 2 hp_s and 2 hp_s + 1; they copy the K tiles
    const int hp_s = tid / AT_BKV;
    const int key_s = tid % AT_BKV;
    // stats: head hh_s, lane cs (launch 2's layout)
    const int st = tid - P::NSC;
    const int hh_s = st / AT_LANES;
    const int cs = st % AT_LANES;
    const bool head_s = role == STAT && g0 + hh_s < group;
    float m = -INFINITY, l = 0.0f;
    // P V: heads 2 hp_v and 2 hp_v + 1, columns lc and lc + 1; they copy the V tiles
    const int t = tid - P::NSC - DC_STAT_THREADS;
    const int hp_v = role == PV ? t / (D / 2) : 0;
    const int lc = role == PV ? (t % (D / 2)) * 2 : 0;
    float o[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    OnePassCopier<D, LD, P::NSC> kcopy;
    OnePassCopier<D, LD, P::NPV> vcopy;
    const int nb = static_cast<int>(nblk);  // < 65536 (n_tiles is checked by the export)
    const int ni = static_cast<int>(n);
    if (role == SCORE) {
        kcopy.init(kc + b * s_kb + kvh * s_kh, s_kt, tid, vec_k != 0);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < nb) kcopy.issue_next(kring + s * P::TILE, ni, tid);
            cp_async_commit();
        }
    } else if (role == PV) {
        vcopy.init(vc + b * s_vb + kvh * s_vh, s_vt, t, vec_v != 0);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < nb) vcopy.issue_next(vring + s * P::TILE, ni, t);
            cp_async_commit();
        }
    }
    for (int e = tid; e < DC_HEADS * D; e += P::THREADS) {
        const int64_t g = g0 + e / D;
        qf[e] = g < group ? f32(q[b * s_qb + (kvh * group + g) * s_qh + e % D]) : 0.0f;
    }
    // Ring slots without divisions: slot holds the tile read this step (block k + 2 for the
    // scores, block k for P V), and the tile issued this step goes to the slot before it.
    int slot = 0;
    // Step k: the scores of block k + 2, the softmax of block k + 1, the P V chains of block k.
    for (int k = -2; k < nb; ++k) {
        if (role == SCORE) cp_async_wait<STAGES - 2>();              // K tile k + 2 (this thread's copies)
        else if (role == PV && k >= 0) cp_async_wait<STAGES - 2>();  // V tile k
        __syncthreads();  // tiles, scores of k + 1, p / alpha of k are visible; the slots refilled below are read
        const int prev = slot == 0 ? STAGES - 1 : slot - 1;
        if (role == SCORE) {
            const int blk = k + 2;
            if (blk + STAGES - 1 < nb) kcopy.issue_next(kring + prev * P::TILE, ni, tid);
            cp_async_commit();
            if (blk < nb) {
                const int key = blk * AT_BKV + key_s;
                float acc[2] = {0.0f, 0.0f};
                const bool vis = key < ni;  // forward_rows: key <= lim = n - 1
                if (vis) dc_dots<D, 2>(kring + slot * P::TILE + key_s * LD, qf + 2 * hp_s * D, acc);
                float* sb = sbuf + (blk & 1) * P::SCORES + 2 * hp_s * AT_BKV + key_s;
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    sb[h * AT_BKV] = vis ? visible_score(acc[h] * scale, true) : -INFINITY;
            }
            slot = slot == STAGES - 1 ? 0 : slot + 1;
        } else if (role == STAT) {
            const int blk = k + 1;
            if (blk >= 0 && blk < nb)
                dc_softmax_block(sbuf + (blk & 1) * P::SCORES + hh_s * AT_BKV, head_s, cs, m, l,
                                 ps + (blk & 1) * P::SCORES + hh_s * AT_BKV, al + (blk & 1) * DC_HEADS + hh_s);
        } else if (k >= 0) {
            if (k + STAGES - 1 < nb) vcopy.issue_next(vring + prev * P::TILE, ni, t);
            cp_async_commit();
            const float* pb = ps + (k & 1) * P::SCORES + 2 * hp_v * AT_BKV;
            const float* ak = al + (k & 1) * DC_HEADS + 2 * hp_v;
            dc_pv_block_2h<LD>(o, ak[0], ak[1], pb, pb + AT_BKV, vring + slot * P::TILE + lc, k * AT_BKV, n);
            slot = slot == STAGES - 1 ? 0 : slot + 1;
        }
    }
    cp_async_wait<0>();
    if (role == STAT && cs == 0) lsum[hh_s] = l;
    __syncthreads();
    if (role != PV) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int hh = 2 * hp_v + h;
        if (g0 + hh >= group) break;
        const float lv = lsum[hh];
        const bool has = lv != 0.0f;  // 0: no visible key (exact 0); NaN: a visible non-finite value
        bf16* orow = out + b * s_ob + (kvh * group + g0 + hh) * s_oh + lc;
        orow[0] = to_bf16(has ? o[h][0] / lv : 0.0f);
        orow[1] = to_bf16(has ? o[h][1] / lv : 0.0f);
    }
}

inline bool rows_vec16(const void* base, int64_t s0, int64_t s1, int64_t s2) {
    return (reinterpret_cast<uintptr_t>(base) & 15u) == 0 && s0 % 8 == 0 && s1 % 8 == 0 && s2 % 8 == 0;
}

// The decode attention's two launches take PDL (when the library's mode has it on, common.cuh) only
// up to this batch. On the H200 (evidence/2026-12-02-h200-decode-26d40ec) they made the Qwen3-8B
// step faster at B = 1 and 8 and slower at B = 16, context 8192 (18.8 ms against 15.1 plain, 14.9
// with every other decode kernel under PDL); a speed choice, the same bits either way.
constexpr int64_t DECODE_PDL_MAX_BATCH = 8;

template <int D, int DSPLIT>
int launch_decode_pv(const float* sc, const void* vc, void* out, const void* seqlens, int64_t batch, int64_t kv_heads,
                     int64_t group, int64_t n_hb, int64_t s_sb, int64_t s_sh, int64_t s_vb, int64_t s_vt,
                     int64_t s_vh, int64_t s_ob, int64_t s_oh, cudaStream_t st) {
    using P = DecodePv<D, DSPLIT>;
    if (int e = prepare(attn_decode_pv_kernel<D, DSPLIT>, P::SMEM)) return e;
    dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads * n_hb), static_cast<unsigned>(DSPLIT));
    return launch_pdl_if(batch <= DECODE_PDL_MAX_BATCH, attn_decode_pv_kernel<D, DSPLIT>, grid, dim3(P::THREADS),
                         P::SMEM, st, sc, static_cast<const bf16*>(vc), static_cast<bf16*>(out),
                         static_cast<const int32_t*>(seqlens), group, n_hb, s_sb, s_sh, s_vb, s_vt, s_vh, s_ob, s_oh,
                         static_cast<int>(rows_vec16(vc, s_vb, s_vt, s_vh)));
}

// The column split of launch 2 when the caller leaves it to the library (d_split 0): doubled while
// the grid has fewer than DECODE_PV_BLOCKS blocks (a speed choice from B and the head shapes only;
// same bits, tested). Launch 2 is one sequential walk over the keys per block, so small batches
// need the split to keep enough blocks in flight.
constexpr int64_t DECODE_PV_BLOCKS = 256;

// The form of a decode step when the caller leaves it to the library (form 0): the one-pass
// kernel from this many blocks (B x KV heads x head blocks) up, else the two launches. A speed
// choice from B and the head shapes only; the same bits (tested).
constexpr int64_t DECODE_ONE_PASS_MIN_BLOCKS = 128;
int g_decode_form = 0;  // 0: the rule above; 1 or 2: that form for every form-0 launch (tests, tools)

// The form a decode step of `blocks` blocks (B x KV heads x head blocks) runs when asked for `form`.
inline int64_t resolve_decode_form(int64_t blocks, int64_t form) {
    if (form != 0) return form;
    if (g_decode_form != 0) return g_decode_form;
    return blocks >= DECODE_ONE_PASS_MIN_BLOCKS ? 2 : 1;
}

template <int D, int STAGES>
int launch_decode_one_pass_stages(const void* q, const void* kc, const void* vc, void* out, const void* seqlens,
                                  int64_t batch, int64_t kv_heads, int64_t group, int64_t n_hb, int64_t s_qb,
                                  int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt,
                                  int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, cudaStream_t st) {
    using P = DecodeOnePass<D, STAGES>;
    if (int e = prepare(attn_decode_one_pass_kernel<D, STAGES>, P::SMEM)) return e;
    dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads * n_hb));
    return launch_pdl_if(batch <= DECODE_PDL_MAX_BATCH, attn_decode_one_pass_kernel<D, STAGES>, grid,
                         dim3(P::THREADS), P::SMEM, st, static_cast<const bf16*>(q), static_cast<const bf16*>(kc),
                         static_cast<const bf16*>(vc), static_cast<bf16*>(out), static_cast<const int32_t*>(seqlens),
                         group, n_hb, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale,
                         static_cast<int>(rows_vec16(kc, s_kb, s_kt, s_kh)),
                         static_cast<int>(rows_vec16(vc, s_vb, s_vt, s_vh)));
}

template <int D>
int launch_decode_one_pass(const void* q, const void* kc, const void* vc, void* out, const void* seqlens,
                           int64_t batch, int64_t kv_heads, int64_t group, int64_t n_hb, int64_t s_qb, int64_t s_qh,
                           int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh,
                           int64_t s_ob, int64_t s_oh, float scale, cudaStream_t st) {
    using S = OnePassStages<D>;
    const bool deep = g_one_pass_stages ? g_one_pass_stages == S::DEEP
                                        : batch * kv_heads * n_hb <= DECODE_ONE_PASS_DEEP_MAX_BLOCKS;
    if (deep)
        return launch_decode_one_pass_stages<D, S::DEEP>(q, kc, vc, out, seqlens, batch, kv_heads, group, n_hb, s_qb,
                                                         s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale,
                                                         st);
    return launch_decode_one_pass_stages<D, S::SHALLOW>(q, kc, vc, out, seqlens, batch, kv_heads, group, n_hb, s_qb,
                                                        s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale,
                                                        st);
}

// form: 0 the library's choice, 1 the two launches (phase 2's column split dsplit, 0: the
// library's), 2 the one-pass kernel.
template <int D>
int launch_decode(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* sc,
                  int64_t batch, int64_t kv_heads, int64_t group, int64_t n_tiles, int64_t s_qb, int64_t s_qh,
                  int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob,
                  int64_t s_oh, float scale, int64_t form, int64_t dsplit, cudaStream_t st) {
    const int64_t n_hb = cdiv(group, static_cast<int64_t>(DC_HEADS));
    const int64_t blocks = batch * kv_heads * n_hb;
    form = resolve_decode_form(blocks, form);
    if (form == 2)
        return launch_decode_one_pass<D>(q, kc, vc, out, seqlens, batch, kv_heads, group, n_hb, s_qb, s_qh, s_kb,
                                         s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, st);
    const int64_t s_sh = n_tiles * AT_BKV;
    const int64_t s_sb = kv_heads * group * s_sh;
    float* scores = static_cast<float*>(sc);
    if (int e = prepare(attn_decode_scores_kernel<D>, DecodeScores<D>::SMEM)) return e;
    dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads * n_hb),
              static_cast<unsigned>(cdiv(s_sh, static_cast<int64_t>(DC_SKEYS))));
    if (int e = launch_pdl_if(batch <= DECODE_PDL_MAX_BATCH, attn_decode_scores_kernel<D>, grid, dim3(DC_SKEYS),
                              DecodeScores<D>::SMEM, st,
                           static_cast<const bf16*>(q), static_cast<const bf16*>(kc),
                           static_cast<const int32_t*>(seqlens), scores, group, n_hb, s_qb, s_qh, s_kb, s_kt, s_kh, s_sb,
                           s_sh, scale, static_cast<int>(rows_vec16(kc, s_kb, s_kt, s_kh))))
        return e;
    if (dsplit == 0) {
        dsplit = 1;
        while (blocks * dsplit < DECODE_PV_BLOCKS && dsplit < 8 && D / (2 * dsplit) >= 16) dsplit *= 2;
    }
#define RL_DECODE_PV(S) launch_decode_pv<D, S>(scores, vc, out, seqlens, batch, kv_heads, group, n_hb, s_sb, s_sh, \
                                               s_vb, s_vt, s_vh, s_ob, s_oh, st)
    if (dsplit == 1) return RL_DECODE_PV(1);
    if constexpr (D / 2 >= 16) {
        if (dsplit == 2) return RL_DECODE_PV(2);
    }
    if constexpr (D / 4 >= 16) {
        if (dsplit == 4) return RL_DECODE_PV(4);
    }
    if constexpr (D / 8 >= 16) {
        if (dsplit == 8) return RL_DECODE_PV(8);
    }
#undef RL_DECODE_PV
    return static_cast<int>(cudaErrorInvalidValue);
}
}  // namespace

RL_EXPORT int64_t rl_attention_block_q(void) { return AT_GROUPS * AT_RPT_PREFILL; }
RL_EXPORT int64_t rl_attention_block_kv(void) { return AT_BKV; }

// Varlen forward. out [Tq, H, D] bf16, lse [H, Tq] fp32 (row stride s_lh). n_mblocks = ceil(max Lq / 64).
RL_EXPORT int rl_attention_fwd(const void* q, const void* k, const void* v, void* out, void* lse, const void* cu_q, const void* cu_k, int64_t batch, int64_t n_mblocks, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_ot, int64_t s_oh, int64_t s_lh, float scale, void* stream) {
    if (batch == 0 || n_mblocks == 0 || heads == 0) return 0;
    if (kv_heads <= 0 || heads % kv_heads || !grid_fits(batch * n_mblocks, heads)) return static_cast<int>(cudaErrorInvalidValue);
    const int64_t group = heads / kv_heads;
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (fwd_uses_tc(head_dim))
        return launch_fwd_tc(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, head_dim, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
    switch (head_dim) {
        case 16: return launch_fwd<16>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        case 32: return launch_fwd<32>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        case 64: return launch_fwd<64>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        case 128: return launch_fwd<128>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        case 256: return launch_fwd<256>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

// Decode step. q [B, H, D], caches [B, S_max, Hkv, D] (strides b, t, h), seqlens int32 [B],
// out [B, H, D]; scores: FP32 scratch of B * H * n_tiles * 64 elements (n_tiles = ceil(S_max / 64)),
// written and read by this step's two-launch form only, or in the declared forward form the split
// decode step's scratch of rl_attention_declared_decode_scratch bytes (attention_tc.cu). form (the
// CUDA-core form's; 0 in the declared one): 0 the library's choice, 1 the two launches, 2 the one-pass kernel; d_split: the two launches' column split (0: the library's choice;
// else 1, 2, 4 or 8 with D / d_split >= 16; only with form 1). The bits depend on neither.
RL_EXPORT int rl_attention_decode_form(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* scores, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t n_tiles, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, int64_t form, int64_t d_split, void* stream) {
    if (batch == 0 || heads == 0 || n_tiles == 0) return 0;
    if (kv_heads <= 0 || heads % kv_heads || n_tiles < 0 || n_tiles > 65535) return static_cast<int>(cudaErrorInvalidValue);
    const int64_t group = heads / kv_heads;
    if (fwd_uses_tc(head_dim)) {  // the declared form's decode (one form; the forms below are the CUDA-core one's)
        if (form != 0 || d_split != 0 || !grid_fits(batch, kv_heads) || cdiv(group, static_cast<int64_t>(64)) > 65535)
            return static_cast<int>(cudaErrorInvalidValue);
        return launch_decode_tc(q, kc, vc, out, seqlens, scores, batch, kv_heads, group, head_dim, n_tiles, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, static_cast<cudaStream_t>(stream));
    }
    if (!grid_fits(batch, kv_heads * cdiv(group, static_cast<int64_t>(DC_HEADS))) || d_split < 0 || d_split > 8 ||
        form < 0 || form > 2 || (form != 1 && d_split != 0))
        return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
#define RL_DECODE_D(DD) launch_decode<DD>(q, kc, vc, out, seqlens, scores, batch, kv_heads, group, n_tiles, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, form, d_split, st)
    switch (head_dim) {
        case 16: return RL_DECODE_D(16);
        case 32: return RL_DECODE_D(32);
        case 64: return RL_DECODE_D(64);
        case 128: return RL_DECODE_D(128);
        case 256: return RL_DECODE_D(256);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
#undef RL_DECODE_D
}

// Decode step in the two-launch form with phase 2's column split d_split (0: the library's);
// arguments as rl_attention_decode_form.
RL_EXPORT int rl_attention_decode_split(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* scores, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t n_tiles, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, int64_t d_split, void* stream) {
    return rl_attention_decode_form(q, kc, vc, out, seqlens, scores, batch, heads, kv_heads, head_dim, n_tiles, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, 1, d_split, stream);
}

// Decode step in the library's form; arguments as rl_attention_decode_form.
RL_EXPORT int rl_attention_decode(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* scores, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t n_tiles, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, void* stream) {
    return rl_attention_decode_form(q, kc, vc, out, seqlens, scores, batch, heads, kv_heads, head_dim, n_tiles, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, 0, 0, stream);
}

// The one-pass form's ring depth for every later launch of this process: 0 the library's choice
// (DECODE_ONE_PASS_DEEP_MAX_BLOCKS), 3 or 6 (2 or 3 at D = 256: the shallow and the deep ring of
// every head dim whose depths these are); returns the previous value, or -1 (and changes nothing)
// for another number. For the sweep tool: the bits do not depend on it.
RL_EXPORT int64_t rl_attention_one_pass_stages(int64_t stages) {
    if (stages != 0 && stages != 2 && stages != 3 && stages != 6) return -1;
    const int64_t old = g_one_pass_stages;
    g_one_pass_stages = static_cast<int>(stages);
    return old;
}

// The form every later decode step of this process takes when its caller leaves the form to the
// library (0: the library's rule, DECODE_ONE_PASS_MIN_BLOCKS; 1 the two launches; 2 the one-pass
// kernel); returns the previous value, or -1 (and changes nothing) for another number. For tests
// that run whole engines in one form: the bits do not depend on it.
RL_EXPORT int64_t rl_attention_decode_default_form(int64_t form) {
    if (form < 0 || form > 2) return -1;
    const int64_t old = g_decode_form;
    g_decode_form = static_cast<int>(form);
    return old;
}

// 1 when a decode step of this shape asked for `form` (as rl_attention_decode_form) runs the two
// launches and so writes the FP32 score scratch, 0 when it runs the one-pass kernel (the caller
// need not allocate the scratch), -1 for shapes or forms the launcher refuses.
RL_EXPORT int64_t rl_attention_decode_uses_scores(int64_t batch, int64_t heads, int64_t kv_heads, int64_t form) {
    if (batch < 0 || heads < 0 || kv_heads <= 0 || heads % kv_heads || form < 0 || form > 2) return -1;
    const int64_t blocks = batch * kv_heads * cdiv(heads / kv_heads, static_cast<int64_t>(DC_HEADS));
    return resolve_decode_form(blocks, form) == 1 ? 1 : 0;
}
