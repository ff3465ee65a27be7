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
// share its tile. The prefill kernel (64 query rows of one head per block) and the decode kernel
// (the H / Hkv query heads of one KV head per block) call the same per-row code with the same
// block size, so a query's output is bitwise the same in a full prefill, a chunk, or a decode
// step. There is no split over the KV axis.
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
// DSPLIT > 1 (decode only): the block owns output columns [d0, d0 + D / DSPLIT) and loads only
// that slice of V (vs rows of Ld<D / DSPLIT>); the scores use all D, and each column's FMA chain is
// the one DSPLIT = 1 runs, so the bits do not depend on DSPLIT.
template <int D, int RPT, int DSPLIT = 1>
__device__ __forceinline__ void forward_rows(const bf16* qs, bf16* ks, bf16* vs, float* ps, const bf16* k_base,
                                             const bf16* v_base, int64_t s_kt, int64_t s_vt, int64_t kv_len,
                                             int64_t n_stop, const int64_t (&lim)[RPT], float scale,
                                             float (&o)[RPT][D / AT_LANES / DSPLIT], float (&m)[RPT], float (&l)[RPT],
                                             int d0 = 0) {
    constexpr int LD = Ld<D>::value;
    constexpr int DV = D / DSPLIT;
    constexpr int LDV = Ld<DV>::value;
    constexpr int DPT = DV / AT_LANES;
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
        load_rows<DV, AT_BKV>(vs, v_base + d0, s_vt, kv0, kv_len);
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
                    const bf16* vr = vs + j * LDV + cs;
#pragma unroll
                    for (int dj = 0; dj < DPT; ++dj) o[i][dj] = __fmaf_rn(pj, f32(vr[AT_LANES * dj]), o[i][dj]);
                }
            } else {  // masked keys (p = 0): their values are absent, not 0 * v
                for (int j = 0; j < AT_BKV; ++j) {
                    const float pj = ps[r * AT_PS_LD + j];
                    const bool vis = kv0 + j <= lim[i];
                    const bf16* vr = vs + j * LDV + cs;
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

// Decode: block (b, kvh, head block) owns query heads kvh * group + [g0, g0 + 16) of sequence b.
// With DSPLIT > 1, blockIdx.z = head block * DSPLIT + slice: the block writes columns
// [slice * D / DSPLIT, (slice + 1) * D / DSPLIT) of its heads (forward_rows: same bits).
template <int D, int DSPLIT>
__global__ void __launch_bounds__(AT_THREADS)
attn_decode_kernel(const bf16* __restrict__ q, const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                   bf16* __restrict__ out, const int32_t* __restrict__ seqlens, int64_t group, int64_t s_qb,
                   int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh,
                   int64_t s_ob, int64_t s_oh, float scale) {
    constexpr int RPT = AT_RPT_DECODE;
    constexpr int BQ = AT_GROUPS * RPT;
    constexpr int LD = Ld<D>::value;
    constexpr int DV = D / DSPLIT;
    constexpr int DPT = DV / AT_LANES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* ks = qs + BQ * LD;
    bf16* vs = ks + AT_BKV * LD;
    float* ps = reinterpret_cast<float*>(vs + AT_BKV * Ld<DV>::value);

    const int64_t b = blockIdx.x;
    const int64_t kvh = blockIdx.y;
    const int64_t g0 = static_cast<int64_t>(blockIdx.z / DSPLIT) * BQ;
    const int d0 = static_cast<int>(blockIdx.z % DSPLIT) * DV;
    const int64_t n = seqlens[b];
    const int rg = threadIdx.x / AT_LANES;
    const int cs = threadIdx.x % AT_LANES;

    // Query rows are the heads kvh * group + g0 + r (stride s_qh between heads).
    load_rows<D, BQ>(qs, q + b * s_qb + kvh * group * s_qh, s_qh, g0, group);
    int64_t lim[RPT];
#pragma unroll
    for (int i = 0; i < RPT; ++i) lim[i] = (g0 + rg + AT_GROUPS * i < group) ? n - 1 : -1;
    float o[RPT][DPT], m[RPT], l[RPT];
    forward_rows<D, RPT, DSPLIT>(qs, ks, vs, ps, kc + b * s_kb + kvh * s_kh, vc + b * s_vb + kvh * s_vh, s_kt, s_vt, n, n,
                                 lim, scale, o, m, l, d0);
#pragma unroll
    for (int i = 0; i < RPT; ++i) {
        const int64_t g = g0 + rg + AT_GROUPS * i;
        if (g >= group) continue;
        const bool has = l[i] != 0.0f;
        bf16* orow = out + b * s_ob + (kvh * group + g) * s_oh;
#pragma unroll
        for (int dj = 0; dj < DPT; ++dj) orow[d0 + cs + AT_LANES * dj] = to_bf16(has ? o[i][dj] / l[i] : 0.0f);
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

template <int D, int DSPLIT>
int launch_decode_split(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, int64_t batch,
                        int64_t kv_heads, int64_t group, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt,
                        int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale,
                        cudaStream_t st) {
    constexpr int BQ = AT_GROUPS * AT_RPT_DECODE;
    constexpr size_t smem = static_cast<size_t>(BQ + AT_BKV) * Ld<D>::value * sizeof(bf16) +
                            static_cast<size_t>(AT_BKV) * Ld<D / DSPLIT>::value * sizeof(bf16) +
                            static_cast<size_t>(BQ) * AT_PS_LD * sizeof(float);
    if (int e = prepare(attn_decode_kernel<D, DSPLIT>, smem)) return e;
    dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads),
              static_cast<unsigned>(cdiv(group, BQ) * DSPLIT));
    attn_decode_kernel<D, DSPLIT><<<grid, AT_THREADS, smem, st>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(kc), static_cast<const bf16*>(vc), static_cast<bf16*>(out),
        static_cast<const int32_t*>(seqlens), group, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale);
    return launch_status();
}

// Decode launch: the head dim is split over up to 8 blocks while the grid would have fewer than
// DECODE_SPLIT_BELOW blocks (a speed choice from B and the head shapes only; same bits, tested).
// On the H200 (Qwen3-8B, context 1024) B = 1 went from 5.6 to 3.6 ms of attention per step split in
// 8; splitting B = 16 (128 blocks) in 2 made the step at context 8192 slower (each block re-reads
// all of K), so only grids below 64 blocks split.
constexpr int64_t DECODE_SPLIT_BELOW = 64;

template <int D>
int launch_decode(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, int64_t batch,
                  int64_t kv_heads, int64_t group, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh,
                  int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, int64_t dsplit,
                  cudaStream_t st) {
    const int64_t blocks = batch * kv_heads * cdiv(group, AT_GROUPS * AT_RPT_DECODE);
    if (dsplit == 0) {
        dsplit = 1;
        while (blocks * dsplit < DECODE_SPLIT_BELOW && dsplit < 8 && D / (2 * dsplit) >= AT_LANES) dsplit *= 2;
    }
#define RL_DECODE(S) launch_decode_split<D, S>(q, kc, vc, out, seqlens, batch, kv_heads, group, s_qb, s_qh, s_kb, s_kt, \
                                               s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, st)
    if (dsplit == 1) return RL_DECODE(1);
    if constexpr (D / 2 >= AT_LANES) {
        if (dsplit == 2) return RL_DECODE(2);
    }
    if constexpr (D / 4 >= AT_LANES) {
        if (dsplit == 4) return RL_DECODE(4);
    }
    if constexpr (D / 8 >= AT_LANES) {
        if (dsplit == 8) return RL_DECODE(8);
    }
#undef RL_DECODE
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

// Decode step with an explicit head-dim split d_split (0: the library's choice; else 1, 2, 4 or 8
// with D / d_split >= 16). q [B, H, D], caches [B, S_max, Hkv, D] (strides b, t, h), seqlens int32 [B], out [B, H, D].
RL_EXPORT int rl_attention_decode_split(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, int64_t d_split, void* stream) {
    if (batch == 0 || heads == 0) return 0;
    if (kv_heads <= 0 || heads % kv_heads || !grid_fits(batch, kv_heads)) return static_cast<int>(cudaErrorInvalidValue);
    const int64_t group = heads / kv_heads;
    if (d_split < 0 || cdiv(group, AT_GROUPS * AT_RPT_DECODE) * (d_split ? d_split : 8) > 65535) return static_cast<int>(cudaErrorInvalidValue);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (head_dim) {
        case 16: return launch_decode<16>(q, kc, vc, out, seqlens, batch, kv_heads, group, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, d_split, st);
        case 32: return launch_decode<32>(q, kc, vc, out, seqlens, batch, kv_heads, group, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, d_split, st);
        case 64: return launch_decode<64>(q, kc, vc, out, seqlens, batch, kv_heads, group, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, d_split, st);
        case 128: return launch_decode<128>(q, kc, vc, out, seqlens, batch, kv_heads, group, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, d_split, st);
        case 256: return launch_decode<256>(q, kc, vc, out, seqlens, batch, kv_heads, group, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, d_split, st);
        default: return static_cast<int>(cudaErrorInvalidValue);
    }
}

// Decode step (the library chooses the head-dim split). q [B, H, D], caches [B, S_max, Hkv, D]
// (strides b, t, h), seqlens int32 [B], out [B, H, D].
RL_EXPORT int rl_attention_decode(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, int64_t batch, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, void* stream) {
    return rl_attention_decode_split(q, kc, vc, out, seqlens, batch, heads, kv_heads, head_dim, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, 0, stream);
}

