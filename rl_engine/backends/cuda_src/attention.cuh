// Shared pieces of the attention kernels (attention.cu: forward and decode; attention_bwd.cu:
// backward). See attention.cu for the arithmetic and the invariance argument.
#pragma once

#include "common.cuh"

namespace rl {
namespace attn {

constexpr int AT_THREADS = 256;
constexpr int AT_BKV = 64;                 // keys per KV block, every path
constexpr int AT_LANES = 16;               // lanes that share one row
constexpr int AT_GROUPS = AT_THREADS / AT_LANES;  // 16 row groups
constexpr int AT_CPT = AT_BKV / AT_LANES;  // 4 key columns per lane
constexpr int AT_PS_LD = AT_BKV + 1;       // FP32 score tile row stride
constexpr int AT_RPT_PREFILL = 4;          // prefill / dQ: 64 query rows per block
constexpr int AT_RPT_DECODE = 1;           // decode: 16 query heads per block
constexpr int AT_BQ_BWD = 64;              // queries per step of the dK/dV kernel

template <int D>
struct Ld {
    static constexpr int value = D + 2;  // bf16 smem row stride: 4-byte aligned rows, no bank conflicts
};

// Copy D BF16 values from global src (unit stride) to shared dst, or zeros when !valid.
template <int D>
__device__ __forceinline__ void copy_row_pair(bf16* dst, const bf16* src, int d, bool valid) {
    __nv_bfloat162 v;
    if (!valid) {
        v = __floats2bfloat162_rn(0.0f, 0.0f);
    } else if (aligned4(src + d)) {
        v = *reinterpret_cast<const __nv_bfloat162*>(src + d);
    } else {
        v.x = src[d];
        v.y = src[d + 1];
    }
    *reinterpret_cast<__nv_bfloat162*>(dst + d) = v;
}

// Rows [0, R) of a tile: row r comes from base + (row0 + r) * stride when row0 + r < limit.
// When every row starts on a 16-byte boundary, each thread issues all of its 16-byte loads before
// its first shared-memory store (one load at a time, each waiting on the store before it, left
// the decode kernel bound by global-load latency); otherwise 4-byte pairs. Either way the same
// bits land in the same places.
template <int D, int R>
__device__ __forceinline__ void load_rows(bf16* dst, const bf16* base, int64_t stride, int64_t row0, int64_t limit) {
    constexpr int VEC = 8;
    if (D % VEC == 0 && aligned16(base) && stride % VEC == 0) {
        constexpr int VPR = D / VEC;
        constexpr int TOTAL = R * VPR;
        constexpr int PER = (TOTAL + AT_THREADS - 1) / AT_THREADS;
        uint4 vals[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int e = threadIdx.x + i * AT_THREADS;
            vals[i] = make_uint4(0u, 0u, 0u, 0u);
            if (e < TOTAL && row0 + e / VPR < limit)
                vals[i] = __ldg(reinterpret_cast<const uint4*>(base + (row0 + e / VPR) * stride + (e % VPR) * VEC));
        }
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int e = threadIdx.x + i * AT_THREADS;
            if (e < TOTAL) {
                // smem rows are D + 2 elements long (4-byte aligned only): four 32-bit stores
                uint32_t* p = reinterpret_cast<uint32_t*>(dst + (e / VPR) * Ld<D>::value + (e % VPR) * VEC);
                p[0] = vals[i].x;
                p[1] = vals[i].y;
                p[2] = vals[i].z;
                p[3] = vals[i].w;
            }
        }
        return;
    }
    constexpr int PAIRS = D / 2;
    for (int e = threadIdx.x; e < R * PAIRS; e += AT_THREADS) {
        const int r = e / PAIRS;
        const int d = (e % PAIRS) * 2;
        const int64_t gr = row0 + r;
        const bool valid = gr < limit;
        copy_row_pair<D>(dst + r * Ld<D>::value, valid ? base + gr * stride : base, d, valid);
    }
}

// Finite (not NaN, not +-inf). A compare, so it means the same under every compiler flag.
__device__ __forceinline__ bool finite(float x) { return fabsf(x) < INFINITY; }

// "Masked means absent" (docs/declared-semantics.md): the other operand of a product whose
// masked weight is 0. Masked non-finite values become 0 (so 0 * NaN never happens); every finite
// value and every visible value is returned unchanged (the identity on finite inputs, and a
// visible NaN / inf still reaches the sum).
__device__ __forceinline__ float absent_if_masked(float x, bool visible) { return (visible || finite(x)) ? x : 0.0f; }

// A visible score of -inf (only a non-finite q or k makes one) becomes NaN, so it cannot silently
// give its key weight 0; masked scores are -inf.
__device__ __forceinline__ float visible_score(float s, bool visible) {
    return visible ? (s == -INFINITY ? NAN : s) : -INFINITY;
}

// FP32 dot product of two BF16 smem rows, FMA chain in increasing d.
template <int D>
__device__ __forceinline__ float dot_row(const bf16* a, const bf16* b) {
    float s = 0.0f;
#pragma unroll 8
    for (int d = 0; d < D; d += 2) {
        const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(a + d));
        const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(b + d));
        s = __fmaf_rn(x.x, y.x, s);
        s = __fmaf_rn(x.y, y.y, s);
    }
    return s;
}


template <typename K>
inline int prepare(K kernel, size_t smem) {
    if (smem > 48 * 1024) {
        const cudaError_t e =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
        if (e != cudaSuccess) return static_cast<int>(e);
    }
    return 0;
}

inline bool grid_fits(int64_t x, int64_t y) { return x >= 0 && x < 2147483647LL && y >= 0 && y <= 65535; }

// The declared form of the forward and decode step (attention_tc.cu; rl_attention_fwd_form 1):
// whether the process runs it for this head dim, and its launchers (arguments as attention.cu's).
bool fwd_uses_tc(int64_t head_dim);
int launch_fwd_tc(const void* q, const void* k, const void* v, void* out, void* lse, const void* cu_q, const void* cu_k,
                  int64_t batch, int64_t n_mblocks, int64_t heads, int64_t group, int64_t head_dim, int64_t s_qt,
                  int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_ot, int64_t s_oh,
                  int64_t s_lh, float scale, cudaStream_t st);
// The decode step: the one-kernel walk, or (when decode_tc_scratch_bytes is positive for the shape) the
// split step in three launches through `scratch` of that many bytes; n_kv_blocks = ceil(S_max / 64).
int64_t decode_tc_scratch_bytes(int64_t batch, int64_t kv_heads, int64_t group, int64_t n_kv_blocks);
int launch_decode_tc(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* scratch,
                     int64_t batch, int64_t kv_heads, int64_t group, int64_t head_dim, int64_t n_kv_blocks,
                     int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt,
                     int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, cudaStream_t st);
// The declared backward (attention_tc.cu; rl_attention_bwd_form 2): whether the process runs it for this
// head dim (attention_bwd.cu), and its launchers (delta; then dK / dV and dQ), arguments as attention_bwd.cu's.
bool bwd_uses_declared(int64_t head_dim);
int launch_delta_declared(const void* o, const void* dout, void* delta, int64_t tq, int64_t heads, int64_t head_dim,
                          int64_t s_ot, int64_t s_oh, int64_t s_dt, int64_t s_dh, int64_t s_lh, cudaStream_t st);
int launch_bwd_declared(const void* q, const void* k, const void* v, const void* dout, const void* lse, const void* delta,
                        void* dq, void* dk, void* dv, const void* cu_q, const void* cu_k, int64_t batch, int64_t n_mblocks,
                        int64_t n_nblocks, int64_t heads, int64_t kv_heads, int64_t group, int64_t head_dim, int64_t s_qt,
                        int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_dt, int64_t s_dh,
                        int64_t s_lh, int64_t s_gqt, int64_t s_gqh, int64_t s_gkt, int64_t s_gkh, int64_t s_gvt,
                        int64_t s_gvh, float scale, cudaStream_t st);

}  // namespace attn
}  // namespace rl
