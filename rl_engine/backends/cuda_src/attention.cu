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
// decode step (two launches, below) computes the same scores, block maxima, exponentials, sums and
// FMA chains for its one query row per head in the same order, so a query's output is bitwise the
// same in a full prefill, a chunk, or a decode step. No sum is split over the KV axis.
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
        float alpha[RPT];
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const int r = rg + AT_GROUPS * i;
            float s[AT_CPT];
#pragma unroll
            for (int jj = 0; jj < AT_CPT; ++jj) {
                const int c = cs + AT_LANES * jj;
                const float dot = dot_row<D>(qs + r * LD, ks + c * LD);
                s[jj] = visible_score(dot * scale, kv0 + c <= lim[i]);
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
// One decode step runs in three launches that together compute exactly forward_rows for each
// query head (the same scores, block maxima, exponentials, sums and FMA chains, in the same order),
// so a decode row stays bitwise the prefill row of the same query (tested):
//   1. scores: block (b, KV head x head block, 128-key chunk); thread t owns key kv0 + t and runs
//      the DC_HEADS dot products of that key (dot_row's FMA chain over d in order, interleaved),
//      then s = visible_score(dot * scale); keys at or past the length get -inf, as a masked key
//      does in forward_rows. The scores go (FP32) to the scratch [B, H, S_cap]. Each key row is
//      read from shared memory once, by one thread, in 16-byte loads.
//   2. softmax statistics: block (b, head). forward_rows walks the 64-key blocks keeping a running
//      maximum m; everything else it computes for block k depends only on m before and after k:
//      ref_k, alpha_k = exp(m_{k-1} - ref_k) (1 when m did not move) and p = exp(s - ref_k). The
//      running maxima are a prefix maximum (exact in any order), so this launch takes the block
//      maxima (one half-warp per block, the forward's lane layout), scans them, and computes every
//      alpha and p in parallel; p replaces the score in the scratch, alpha goes to its own part.
//      Each block's sum of p is formed in the forward's order (lane cs: (p_cs + p_cs+16) +
//      (p_cs+32 + p_cs+48), then the half-warp butterfly) and one thread runs the l chain
//      l = l * alpha_k + psum_k in block order.
//   3. P V: block (b, KV head x head block, column slice); each warp owns 16 output columns of the
//      group's DC_HEADS heads (lane: head lane / 8, columns 2 (lane % 8) + {0, 1}) and streams its
//      own V columns, the heads' p and alphas block by block through a private cp.async ring (no
//      block barrier), running o = o * alpha_k, then o = fma(p_j, v_j, o) for j in order. The
//      column slice (d_split, 1 .. 8) only decides which output columns a block owns: each
//      column's chain is the same, so the bits do not depend on it.
// An earlier form did launches 2 and 3 in one, with two "stats" warps computing block k + 1's
// softmax step while the others ran block k's chains, a block barrier per 64 keys: about 0.9 us
// per block on the H200 at every batch size (evidence/2026-12-02-h200-decode-80982b6, ncu).
constexpr int DC_HEADS = 4;                           // query heads per block, both launches
constexpr int DC_SKEYS = 128;                         // keys (threads) per block of launch 1
static_assert(AT_BKV == 4 * AT_LANES && AT_CPT == 4, "the forward's lane layout: 4 keys per lane");

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
    if (vis) {
        const bf16* kr = ks + t * LDK;
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
            for (int h = 0; h < DC_HEADS; ++h) {
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
#pragma unroll
    for (int h = 0; h < DC_HEADS; ++h) {
        if (g0 + h < group)
            sc[b * s_sb + (kvh * group + g0 + h) * s_sh + key] = vis ? visible_score(acc[h] * scale, true) : -INFINITY;
    }
}

// Launch 2. Scratch: scores / p [B, H, S_cap] (row stride s_sh), alpha [B, kv_heads * n_hb,
// n_tiles, DC_HEADS] (launch 3's block y reads its heads' alphas of block k as one 16-byte chunk),
// l [B, H].
constexpr int DS_THREADS = 256;  // 16 half-warps
constexpr int DS_CHUNK = 64;     // 64-key blocks per pass (their scores staged in shared memory)

__global__ void __launch_bounds__(DS_THREADS)
attn_decode_softmax_kernel(float* __restrict__ sc, float* __restrict__ alpha, float* __restrict__ lsum,
                           const int32_t* __restrict__ seqlens, int64_t heads, int64_t group, int64_t n_hb,
                           int64_t n_tiles, int64_t s_sb, int64_t s_sh) {
    __shared__ float ss[DS_CHUNK * AT_BKV];
    __shared__ float bm[DS_CHUNK], ref[DS_CHUNK], al[DS_CHUNK], ps[DS_CHUNK];
    __shared__ float carry;  // the running maximum after the previous pass
    const int64_t b = blockIdx.x;
    const int64_t h = blockIdx.y;
    const int64_t nblk = cdiv(static_cast<int64_t>(seqlens[b]), static_cast<int64_t>(AT_BKV));
    const int tid = threadIdx.x;
    const int hw = tid / AT_LANES;  // half-warp: one 64-key block at a time
    const int cs = tid % AT_LANES;  // the forward's lane: keys cs + 16 jj
    const int lane = tid & 31;
    float* srow = sc + b * s_sb + h * s_sh;
    const int64_t y = (h / group) * n_hb + (h % group) / DC_HEADS;
    float* arow = alpha + ((b * (heads / group) * n_hb + y) * n_tiles) * DC_HEADS + (h % group) % DC_HEADS;
    float l = 0.0f;  // thread 0
    if (tid == 0) carry = -INFINITY;
    for (int64_t c0 = 0; c0 < nblk; c0 += DS_CHUNK) {
        const int nb = static_cast<int>(nblk - c0 < DS_CHUNK ? nblk - c0 : DS_CHUNK);
        for (int k = hw; k < DS_CHUNK; k += DS_THREADS / AT_LANES) {  // the same trip count in every half-warp
            float s[AT_CPT];
#pragma unroll
            for (int jj = 0; jj < AT_CPT; ++jj) {
                s[jj] = k < nb ? srow[(c0 + k) * AT_BKV + cs + AT_LANES * jj] : -INFINITY;
                ss[k * AT_BKV + cs + AT_LANES * jj] = s[jj];
            }
            const float v = half_warp_max(fmaxf(fmaxf(s[0], s[1]), fmaxf(s[2], s[3])));
            if (cs == 0) bm[k] = v;
        }
        __syncthreads();
        if (tid < 32) {  // running maxima: lane i owns blocks 2i and 2i + 1 (fmaxf: exact, NaN-ignoring)
            const float before = carry;
            const float x0 = bm[2 * lane];
            const float x1 = bm[2 * lane + 1];
            float inc = fmaxf(x0, x1);
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const float t = __shfl_up_sync(0xffffffffu, inc, off);
                if (lane >= off) inc = fmaxf(inc, t);
            }
            float excl = __shfl_up_sync(0xffffffffu, inc, 1);
            if (lane == 0) excl = -INFINITY;
            const float m_prev = fmaxf(before, excl);  // m before block 2i
            const float m0 = fmaxf(m_prev, x0);
            const float m1 = fmaxf(m0, x1);
            const float r0 = (m0 == -INFINITY) ? 0.0f : m0;
            const float r1 = (m1 == -INFINITY) ? 0.0f : m1;
            ref[2 * lane] = r0;
            ref[2 * lane + 1] = r1;
            al[2 * lane] = (m0 == m_prev) ? 1.0f : expf(m_prev - r0);
            al[2 * lane + 1] = (m1 == m0) ? 1.0f : expf(m0 - r1);
            __syncwarp();  // every lane has read carry
            if (lane == 31) carry = m1;  // blocks past nb have maximum -inf: m after the last one
        }
        __syncthreads();
        for (int k = hw; k < DS_CHUNK; k += DS_THREADS / AT_LANES) {
            const float r = ref[k];
            float p[AT_CPT];
#pragma unroll
            for (int jj = 0; jj < AT_CPT; ++jj) p[jj] = expf(ss[k * AT_BKV + cs + AT_LANES * jj] - r);
            if (k < nb) {
#pragma unroll
                for (int jj = 0; jj < AT_CPT; ++jj) srow[(c0 + k) * AT_BKV + cs + AT_LANES * jj] = p[jj];
            }
            const float psum = half_warp_sum((p[0] + p[1]) + (p[2] + p[3]));
            if (cs == 0) ps[k] = psum;
        }
        __syncthreads();
        for (int k = tid; k < nb; k += DS_THREADS) arow[(c0 + k) * DC_HEADS] = al[k];
        if (tid == 0)
            for (int k = 0; k < nb; ++k) l = l * al[k] + ps[k];
        __syncthreads();  // the next pass overwrites the shared arrays
    }
    if (tid == 0) lsum[b * heads + h] = l;
}

template <int D, int DSPLIT>
struct DecodePv {
    static constexpr int DV = D / DSPLIT;            // output columns per block
    static constexpr int WARPS = DV / 16;            // 16 columns per warp
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int DEPTH = WARPS >= 16 ? 3 : (WARPS >= 8 ? 4 : 8);  // ring slots per warp (<= 151 KB a block)
    static constexpr int PLD = AT_BKV + 4;           // p row stride: the heads' float4 reads hit distinct banks
    static constexpr int V_BYTES = AT_BKV * 16 * 2;  // one slot's V: 64 keys x 16 columns
    static constexpr int P_FLOATS = DC_HEADS * PLD + DC_HEADS;  // p of the heads, then their alphas
    static constexpr int SLOT = V_BYTES + P_FLOATS * 4;
    static constexpr size_t SMEM = static_cast<size_t>(WARPS) * DEPTH * SLOT;
    static_assert(DV >= 16 && DV % 16 == 0, "whole 16-column warps");
    static_assert(SLOT % 16 == 0 && (PLD * 4) % 16 == 0, "16-byte copies");
    static_assert(DC_HEADS * 8 == 32, "a lane per (head, column pair)");
};

template <int D, int DSPLIT>
__global__ void __launch_bounds__(DecodePv<D, DSPLIT>::THREADS)
attn_decode_pv_kernel(const float* __restrict__ sc, const float* __restrict__ alpha, const float* __restrict__ lsum,
                      const bf16* __restrict__ vc, bf16* __restrict__ out, const int32_t* __restrict__ seqlens,
                      int64_t heads, int64_t group, int64_t n_hb, int64_t n_tiles, int64_t s_sb, int64_t s_sh,
                      int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, int vec) {
    using P = DecodePv<D, DSPLIT>;
    constexpr int DEPTH = P::DEPTH;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    unsigned char* ring = smem_raw + static_cast<size_t>(warp) * DEPTH * P::SLOT;
    const int64_t b = blockIdx.x;
    const int64_t y = blockIdx.y;
    const int64_t kvh = y / n_hb;
    const int64_t g0 = (y % n_hb) * DC_HEADS;
    const int64_t n = seqlens[b];
    const int64_t nblk = cdiv(n, static_cast<int64_t>(AT_BKV));
    const bf16* vbase = vc + b * s_vb + kvh * s_vh + static_cast<int64_t>(blockIdx.z) * P::DV + 16 * warp;
    // this lane's p copies: chunk f = lane + 32 i is keys 4 (f % 16) .. + 3 of head f / 16
    const float* psrc[2];
    bool pok[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int f = lane + 32 * i;
        pok[i] = g0 + f / 16 < group;
        psrc[i] = sc + b * s_sb + (kvh * group + g0 + (pok[i] ? f / 16 : 0)) * s_sh + 4 * (f % 16);
    }
    const float* asrc = alpha + (b * static_cast<int64_t>(gridDim.y) + y) * n_tiles * DC_HEADS;
    auto issue = [&](int64_t k) {
        unsigned char* slot = ring + (k % DEPTH) * P::SLOT;
        bf16* vs = reinterpret_cast<bf16*>(slot);
        float* pt = reinterpret_cast<float*>(slot + P::V_BYTES);
        const int64_t kv0 = k * AT_BKV;
        if (vec) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {  // 64 rows x two 16-byte halves
                const int e = lane + 32 * i;
                const int r = e >> 1;
                const int h8 = 8 * (e & 1);
                const bool ok = kv0 + r < n;
                cp_async16(vs + r * 16 + h8, ok ? vbase + (kv0 + r) * s_vt + h8 : vbase, ok ? 16 : 0);
            }
        } else {  // rows past n are zeros, as the 16-byte path's zero fill
            for (int e = lane; e < AT_BKV * 16; e += 32) {
                const int r = e / 16;
                vs[e] = kv0 + r < n ? vbase[(kv0 + r) * s_vt + e % 16] : to_bf16(0.0f);
            }
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int f = lane + 32 * i;
            cp_async16(pt + (f / 16) * P::PLD + 4 * (f % 16), pok[i] ? psrc[i] + kv0 : sc, pok[i] ? 16 : 0);
        }
        if (lane == 0) cp_async16(pt + DC_HEADS * P::PLD, asrc + k * DC_HEADS, 16);
    };

    const int hh = lane >> 3;        // this lane's head in the group block
    const int cp2 = 2 * (lane & 7);  // its two columns in the warp's 16
    float o0 = 0.0f, o1 = 0.0f;
#pragma unroll
    for (int s = 0; s < DEPTH - 1; ++s) {
        if (s < nblk) issue(s);
        cp_async_commit();
    }
    for (int64_t k = 0; k < nblk; ++k) {
        cp_async_wait<DEPTH - 2>();
        __syncwarp();  // slot k has landed for every lane; every lane is done with slot k - 1
        if (k + DEPTH - 1 < nblk) issue(k + DEPTH - 1);
        cp_async_commit();
        const unsigned char* slot = ring + (k % DEPTH) * P::SLOT;
        const bf16* vt = reinterpret_cast<const bf16*>(slot) + cp2;
        const float* pt = reinterpret_cast<const float*>(slot + P::V_BYTES);
        const float a = pt[DC_HEADS * P::PLD + hh];
        const float4* pb = reinterpret_cast<const float4*>(pt + hh * P::PLD);
        o0 = o0 * a;
        o1 = o1 * a;
        const int64_t kv0 = k * AT_BKV;
        if (kv0 + AT_BKV - 1 <= n - 1) {  // the row sees the whole block
#pragma unroll 4
            for (int j4 = 0; j4 < AT_BKV / 4; ++j4) {
                const float4 p4 = pb[j4];
                const float pj[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const float2 v2 =
                        __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vt + (4 * j4 + i) * 16));
                    o0 = __fmaf_rn(pj[i], v2.x, o0);
                    o1 = __fmaf_rn(pj[i], v2.y, o1);
                }
            }
        } else {  // masked keys (p = 0): their values are absent, not 0 * v
            const float* pf = reinterpret_cast<const float*>(pb);
            for (int j = 0; j < AT_BKV; ++j) {
                const float pj = pf[j];
                const bool vis = kv0 + j <= n - 1;
                const float2 v2 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(vt + j * 16));
                o0 = __fmaf_rn(pj, absent_if_masked(v2.x, vis), o0);
                o1 = __fmaf_rn(pj, absent_if_masked(v2.y, vis), o1);
            }
        }
    }
    cp_async_wait<0>();
    if (g0 + hh >= group) return;
    const int64_t head = kvh * group + g0 + hh;
    const float lv = lsum[b * heads + head];
    const bool has = lv != 0.0f;  // 0: no visible key (exact 0); NaN: a visible non-finite value
    bf16* orow = out + b * s_ob + head * s_oh + static_cast<int64_t>(blockIdx.z) * P::DV + 16 * warp + cp2;
    orow[0] = to_bf16(has ? o0 / lv : 0.0f);
    orow[1] = to_bf16(has ? o1 / lv : 0.0f);
}

inline bool rows_vec16(const void* base, int64_t s0, int64_t s1, int64_t s2) {
    return (reinterpret_cast<uintptr_t>(base) & 15u) == 0 && s0 % 8 == 0 && s1 % 8 == 0 && s2 % 8 == 0;
}

// Floats of the decode scratch (launch 2's comment): scores / p, alpha, l.
inline int64_t decode_scratch_floats(int64_t batch, int64_t kv_heads, int64_t group, int64_t n_tiles) {
    const int64_t n_hb = cdiv(group, static_cast<int64_t>(DC_HEADS));
    return batch * kv_heads * group * n_tiles * AT_BKV + batch * kv_heads * n_hb * n_tiles * DC_HEADS +
           batch * kv_heads * group;
}

template <int D, int DSPLIT>
int launch_decode_pv(const float* sc, const float* alpha, const float* lsum, const void* vc, void* out,
                     const void* seqlens, int64_t batch, int64_t kv_heads, int64_t group, int64_t n_hb,
                     int64_t n_tiles, int64_t s_sb, int64_t s_sh, int64_t s_vb, int64_t s_vt, int64_t s_vh,
                     int64_t s_ob, int64_t s_oh, cudaStream_t st) {
    using P = DecodePv<D, DSPLIT>;
    if (int e = prepare(attn_decode_pv_kernel<D, DSPLIT>, P::SMEM)) return e;
    dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads * n_hb), static_cast<unsigned>(DSPLIT));
    attn_decode_pv_kernel<D, DSPLIT><<<grid, P::THREADS, P::SMEM, st>>>(
        sc, alpha, lsum, static_cast<const bf16*>(vc), static_cast<bf16*>(out), static_cast<const int32_t*>(seqlens),
        kv_heads * group, group, n_hb, n_tiles, s_sb, s_sh, s_vb, s_vt, s_vh, s_ob, s_oh,
        static_cast<int>(rows_vec16(vc, s_vb, s_vt, s_vh)));
    return launch_status();
}

// The column split of launch 3 when the caller leaves it to the library (d_split 0): doubled while
// the grid has fewer than DECODE_PV_BLOCKS blocks (a speed choice from B and the head shapes only;
// same bits, tested): small batches get more, smaller blocks spread over more SMs.
constexpr int64_t DECODE_PV_BLOCKS = 256;

template <int D>
int launch_decode(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* sc,
                  int64_t batch, int64_t kv_heads, int64_t group, int64_t n_tiles, int64_t s_qb, int64_t s_qh,
                  int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob,
                  int64_t s_oh, float scale, int64_t dsplit, cudaStream_t st) {
    const int64_t n_hb = cdiv(group, static_cast<int64_t>(DC_HEADS));
    const int64_t s_sh = n_tiles * AT_BKV;
    const int64_t s_sb = kv_heads * group * s_sh;
    float* scores = static_cast<float*>(sc);
    float* alpha = scores + batch * s_sb;
    float* lsum = alpha + batch * kv_heads * n_hb * n_tiles * DC_HEADS;
    if (int e = prepare(attn_decode_scores_kernel<D>, DecodeScores<D>::SMEM)) return e;
    dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads * n_hb),
              static_cast<unsigned>(cdiv(s_sh, static_cast<int64_t>(DC_SKEYS))));
    attn_decode_scores_kernel<D><<<grid, DC_SKEYS, DecodeScores<D>::SMEM, st>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(kc), static_cast<const int32_t*>(seqlens), scores, group,
        n_hb, s_qb, s_qh, s_kb, s_kt, s_kh, s_sb, s_sh, scale, static_cast<int>(rows_vec16(kc, s_kb, s_kt, s_kh)));
    if (int e = launch_status()) return e;
    attn_decode_softmax_kernel<<<dim3(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads * group)), DS_THREADS,
                                 0, st>>>(scores, alpha, lsum, static_cast<const int32_t*>(seqlens), kv_heads * group,
                                          group, n_hb, n_tiles, s_sb, s_sh);
    if (int e = launch_status()) return e;
    const int64_t blocks = batch * kv_heads * n_hb;
    if (dsplit == 0) {
        dsplit = 1;
        while (blocks * dsplit < DECODE_PV_BLOCKS && dsplit < 8 && D / (2 * dsplit) >= 16) dsplit *= 2;
    }
#define RL_DECODE_PV(S) launch_decode_pv<D, S>(scores, alpha, lsum, vc, out, seqlens, batch, kv_heads, group, n_hb, \
                                               n_tiles, s_sb, s_sh, s_vb, s_vt, s_vh, s_ob, s_oh, st)
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
    switch (head_dim) {
        case 16: return launch_fwd<16>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        case 32: return launch_fwd<32>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        case 64: return launch_fwd<64>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        case 128: return launch_fwd<128>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        case 256: return launch_fwd<256>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

// Floats of the FP32 scratch a decode step needs (scores / p, alpha, l: launch 2's comment), or -1
// for head counts the decode cannot run.
RL_EXPORT int64_t rl_attention_decode_scratch(int64_t batch, int64_t heads, int64_t kv_heads, int64_t n_tiles) {
    if (batch < 0 || heads <= 0 || kv_heads <= 0 || heads % kv_heads || n_tiles < 0) return -1;
    return decode_scratch_floats(batch, kv_heads, heads / kv_heads, n_tiles);
}

// Decode step. q [B, H, D], caches [B, S_max, Hkv, D] (strides b, t, h), seqlens int32 [B],
// out [B, H, D]; scores: FP32 scratch of rl_attention_decode_scratch(B, H, Hkv, n_tiles) elements
// (n_tiles = ceil(S_max / 64)), written and read by this step only. d_split: launch 3's column
// split (0: the library's choice; else 1, 2, 4 or 8 with D / d_split >= 16); the bits do not
// depend on it.
RL_EXPORT int rl_attention_decode_split(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* scores, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t n_tiles, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, int64_t d_split, void* stream) {
    if (batch == 0 || heads == 0 || n_tiles == 0) return 0;
    if (kv_heads <= 0 || heads % kv_heads || n_tiles < 0 || n_tiles > 65535) return static_cast<int>(cudaErrorInvalidValue);
    const int64_t group = heads / kv_heads;
    if (!grid_fits(batch, kv_heads * cdiv(group, static_cast<int64_t>(DC_HEADS))) || !grid_fits(batch, heads) ||
        d_split < 0 || d_split > 8)
        return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
#define RL_DECODE_D(DD) launch_decode<DD>(q, kc, vc, out, seqlens, scores, batch, kv_heads, group, n_tiles, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, d_split, st)
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

// Decode step (the library chooses launch 3's column split); arguments as rl_attention_decode_split.
RL_EXPORT int rl_attention_decode(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* scores, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t n_tiles, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, void* stream) {
    return rl_attention_decode_split(q, kc, vc, out, seqlens, scores, batch, heads, kv_heads, head_dim, n_tiles, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, 0, stream);
}
