// GEMMs of the cuda_bf16 backend.
//
// 1. Tensor-core tree GEMM (det_gemm, lm_head forward, linear_logp logits):
//    C [M, N] = A [M, K] @ B [K, N], BF16 operands with any strides, FP32 accumulation through
//    WMMA 16x16x16 BF16 tiles (HMMA). One block owns one 128 x 128 output tile and walks the K
//    range in the contract's Option B tree (declared_exceptions.det_gemm):
//      * the K axis is split by mid = lo + (hi - lo) / 2, DEPTH times (the host passes the leaf
//        bounds, computed by rl_engine.ops.det_gemm.api.mid_split_bounds);
//      * each leaf is accumulated in FP32 over 32-wide K steps that start at the leaf's own first
//        index and run in increasing k (the tail step is zero-padded past the leaf's end), then
//        rounded once to BF16;
//      * merges are bf16(fp32(l) + fp32(r)), ((l0 + l1) + (l2 + l3)) for DEPTH 2.
//    Because every leaf starts its K steps at its own first index, a tensor-parallel rank holding
//    the K range of one subtree (DEPTH - log2(parts)) computes that subtree with exactly the same
//    instructions, so a BF16 merge of the ranks equals the unsplit product bit for bit.
//    DEPTH 0 with OUT_F32 is a plain FP32-accumulated GEMM with FP32 output (lm_head logits).
//    Leaf-parallel form (rl_det_gemm_leaves, for decode-sized outputs): one block per tile and
//    leaf runs the same leaf loop, the leaves go through a BF16 workspace, and a second kernel
//    applies the same merges: the same bits with 2^DEPTH times the blocks.
//    Pipelined forms (tree_pipe_kernel, forms 1 and 2 of rl_tree_gemm_form; the WMMA kernels are form 0):
//    the same tree with the operands streamed through a cp.async ring and multiplied with ldmatrix +
//    mma.sync, for the fused tree, the leaf-parallel leaves and the FP32-output GEMM; the same bits.
//    Form 3 (tree_wgmma_kernel, the default since the H200 gave form 0's bits with it): the fused
//    tree and the leaf-parallel leaves (the training step's three layouts) and the FP32 logits with
//    the warpgroup MMA (m64n128k16).
//    Batch invariance: output (m, n) is produced from row m of A and column n of B by the same
//    sequence of MMA instructions whatever M, the tile position of the row, or the strides (the
//    loaders only change how values reach shared memory, never which values or in which order
//    they are reduced).
//
// 2. CUDA-core FP32 GEMM (lm_head / linear_logp backward, FP32 upstream gradients):
//    C [M, N] (=, or +=) A [M, K] @ B [K, N] with FP32 or BF16 operands upcast to FP32, one FP32
//    accumulator per output element updated with __fmaf_rn in increasing k, stored once (rounded
//    to BF16, or FP32; with ACCUM the finished FP32 sum is added to C with one FP32 addition).
#include <mma.h>

#include <type_traits>

#include "common.cuh"
#include "gemm.cuh"

using namespace rl;
using namespace nvcuda;

namespace {

// ---------------------------------------------------------------------------------------------
// Tensor-core tree GEMM
// ---------------------------------------------------------------------------------------------
constexpr int TB_M = 128;
constexpr int TB_N = 128;
constexpr int TB_LD = TB_K + 8;  // smem row stride (elements): 80 bytes, a multiple of 16
constexpr int TB_THREADS = 256;  // 8 warps: 2 along M (64 rows each) x 4 along N (32 cols each)
constexpr int TB_WARP_M = 64;
constexpr int TB_WARP_N = 32;
constexpr int FM = TB_WARP_M / 16;  // 4 fragments along M per warp
constexpr int FN = TB_WARP_N / 16;  // 2 fragments along N per warp

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> FragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> FragB;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FragC;
constexpr int FRAG_ELEMS = sizeof(FragC::x) / sizeof(float);

struct __align__(128) TreeSmem {
    bf16 a[TB_M][TB_LD];          // A tile, row major: a[m][k]
    bf16 b[TB_N][TB_LD];          // B tile, transposed: b[n][k] (col-major K x N for WMMA)
    float stage[8][16 * 16];      // per-warp staging of one output fragment
};

// Load rows [r0, r0 + R) x k in [k0, k0 + TB_K) of an operand addressed as src[r * s_r + k * s_k]
// into dst[r][k]; entries with r >= r_lim or k >= k_lim are zero. The path (16-byte vectors along
// k, along r, or scalars) is chosen from strides and alignment; it never changes the values.
template <int R>
__device__ __forceinline__ void load_tile(bf16 (*dst)[TB_LD], const bf16* __restrict__ src, int64_t s_r, int64_t s_k,
                                          int64_t r0, int64_t r_lim, int64_t k0, int64_t k_lim) {
    const unsigned short* s16 = reinterpret_cast<const unsigned short*>(src);
    const int tid = threadIdx.x;
    if (s_k == 1) {
        constexpr int VPR = TB_K / 8;
        for (int v = tid; v < R * VPR; v += TB_THREADS) {
            const int r = v / VPR;
            const int kc = (v % VPR) * 8;
            const int64_t gr = r0 + r;
            const int64_t gk = k0 + kc;
            uint4 val = make_uint4(0u, 0u, 0u, 0u);
            if (gr < r_lim && gk < k_lim) {
                const bf16* p = src + gr * s_r + gk;
                if (gk + 8 <= k_lim && aligned16(p)) {
                    val = __ldg(reinterpret_cast<const uint4*>(p));
                } else {
                    unsigned short t[8];
#pragma unroll
                    for (int i = 0; i < 8; ++i) t[i] = (gk + i < k_lim) ? s16[gr * s_r + gk + i] : 0;
                    val.x = t[0] | (static_cast<unsigned>(t[1]) << 16);
                    val.y = t[2] | (static_cast<unsigned>(t[3]) << 16);
                    val.z = t[4] | (static_cast<unsigned>(t[5]) << 16);
                    val.w = t[6] | (static_cast<unsigned>(t[7]) << 16);
                }
            }
            *reinterpret_cast<uint4*>(&dst[r][kc]) = val;
        }
    } else if (s_r == 1) {
        constexpr int VPK = R / 8;
        for (int v = tid; v < TB_K * VPK; v += TB_THREADS) {
            const int k = v / VPK;
            const int rc = (v % VPK) * 8;
            const int64_t gr = r0 + rc;
            const int64_t gk = k0 + k;
            unsigned short t[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) t[i] = 0;
            if (gk < k_lim && gr < r_lim) {
                const bf16* p = src + gk * s_k + gr;
                if (gr + 8 <= r_lim && aligned16(p)) {
                    const uint4 val = __ldg(reinterpret_cast<const uint4*>(p));
                    t[0] = val.x & 0xffffu; t[1] = val.x >> 16;
                    t[2] = val.y & 0xffffu; t[3] = val.y >> 16;
                    t[4] = val.z & 0xffffu; t[5] = val.z >> 16;
                    t[6] = val.w & 0xffffu; t[7] = val.w >> 16;
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) t[i] = (gr + i < r_lim) ? s16[gk * s_k + gr + i] : 0;
                }
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) put_bits(&dst[rc + i][k], t[i]);
        }
    } else {
        for (int e = tid; e < R * TB_K; e += TB_THREADS) {
            const int r = e / TB_K;
            const int k = e % TB_K;
            const int64_t gr = r0 + r;
            const int64_t gk = k0 + k;
            const unsigned short v = (gr < r_lim && gk < k_lim) ? s16[gr * s_r + gk * s_k] : 0;
            put_bits(&dst[r][k], v);
        }
    }
}

// FP32 accumulation of one leaf [lo, hi) of the K axis for this warp's 64 x 32 sub-tile.
__device__ __forceinline__ void tree_leaf(FragC (&acc)[FM][FN], TreeSmem& sm, const TreeArgs& g, int64_t m0,
                                          int64_t n0, int64_t lo, int64_t hi, int wm, int wn) {
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int64_t k0 = lo; k0 < hi; k0 += TB_K) {
        __syncthreads();  // the previous step's fragments have been read
        load_tile<TB_M>(sm.a, g.a, g.s_am, g.s_ak, m0, g.M, k0, hi);
        load_tile<TB_N>(sm.b, g.b, g.s_bn, g.s_bk, n0, g.N, k0, hi);
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TB_K; kk += 16) {
            FragA fa[FM];
            FragB fb[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], &sm.a[wm * TB_WARP_M + i * 16][kk], TB_LD);
#pragma unroll
            for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(fb[j], &sm.b[wn * TB_WARP_N + j * 16][kk], TB_LD);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    }
}

struct LeafBf16 {
    bf16 v[FM][FN][FRAG_ELEMS];
};

__device__ __forceinline__ void round_leaf(LeafBf16& out, const FragC (&acc)[FM][FN]) {
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
            for (int e = 0; e < FRAG_ELEMS; ++e) out.v[i][j][e] = to_bf16(acc[i][j].x[e]);
}

// left = bf16(fp32(left) + fp32(right)). Accumulator fragments of one type share one element
// mapping, so element e of two fragments is the same (row, col).
__device__ __forceinline__ void merge_into(LeafBf16& left, const LeafBf16& right) {
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
            for (int e = 0; e < FRAG_ELEMS; ++e)
                left.v[i][j][e] = to_bf16(f32(left.v[i][j][e]) + f32(right.v[i][j][e]));
}

template <bool OUT_F32>
__device__ __forceinline__ void store_fragment(TreeSmem& sm, const TreeArgs& g, const FragC& frag, int64_t r0,
                                               int64_t c0) {
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    float* st = sm.stage[warp];
    wmma::store_matrix_sync(st, frag, 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
        const int64_t r = r0 + e / 16;
        const int64_t c = c0 + e % 16;
        if (r < g.M && c < g.N) {
            const int64_t off = r * g.s_cm + c * g.s_cn;
            if (OUT_F32) {
                static_cast<float*>(g.c)[off] = st[e];
            } else {
                // The value is already a BF16 number held in FP32: the conversion is exact.
                static_cast<bf16*>(g.c)[off] = to_bf16(st[e]);
            }
        }
    }
    __syncwarp();
}

template <int DEPTH, bool OUT_F32>
__global__ void __launch_bounds__(TB_THREADS) tree_gemm_kernel(TreeArgs g) {
    __shared__ TreeSmem sm;
    const int warp = threadIdx.x >> 5;
    const int wm = warp / 4;
    const int wn = warp % 4;
    const int64_t m0 = static_cast<int64_t>(blockIdx.x) * TB_M;
    const int64_t n0 = static_cast<int64_t>(blockIdx.y) * TB_N;
    FragC acc[FM][FN];

    if (OUT_F32) {
        static_assert(!OUT_F32 || DEPTH == 0, "FP32 output is the untreed FP32 GEMM");
        tree_leaf(acc, sm, g, m0, n0, g.bounds[0], g.bounds[1], wm, wn);
#pragma unroll
        for (int i = 0; i < FM; ++i)
#pragma unroll
            for (int j = 0; j < FN; ++j)
                store_fragment<true>(sm, g, acc[i][j], m0 + wm * TB_WARP_M + i * 16, n0 + wn * TB_WARP_N + j * 16);
        return;
    }

    LeafBf16 res;
    if (DEPTH == 0) {
        tree_leaf(acc, sm, g, m0, n0, g.bounds[0], g.bounds[1], wm, wn);
        round_leaf(res, acc);
    } else if (DEPTH == 1) {
        LeafBf16 right;
        tree_leaf(acc, sm, g, m0, n0, g.bounds[0], g.bounds[1], wm, wn);
        round_leaf(res, acc);
        tree_leaf(acc, sm, g, m0, n0, g.bounds[1], g.bounds[2], wm, wn);
        round_leaf(right, acc);
        merge_into(res, right);
    } else {
        LeafBf16 tmp, s23;
        tree_leaf(acc, sm, g, m0, n0, g.bounds[0], g.bounds[1], wm, wn);
        round_leaf(res, acc);  // l0
        tree_leaf(acc, sm, g, m0, n0, g.bounds[1], g.bounds[2], wm, wn);
        round_leaf(tmp, acc);  // l1
        merge_into(res, tmp);  // l0 + l1
        tree_leaf(acc, sm, g, m0, n0, g.bounds[2], g.bounds[3], wm, wn);
        round_leaf(s23, acc);  // l2
        tree_leaf(acc, sm, g, m0, n0, g.bounds[3], g.bounds[4], wm, wn);
        round_leaf(tmp, acc);  // l3
        merge_into(s23, tmp);  // l2 + l3
        merge_into(res, s23);  // (l0 + l1) + (l2 + l3)
    }
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            FragC out;
#pragma unroll
            for (int e = 0; e < FRAG_ELEMS; ++e) out.x[e] = f32(res.v[i][j][e]);
            store_fragment<false>(sm, g, out, m0 + wm * TB_WARP_M + i * 16, n0 + wn * TB_WARP_N + j * 16);
        }
}

// Leaf-parallel form of the same tree (decode-sized outputs): block (tile_m, tile_n, leaf) runs
// tree_leaf over its leaf exactly as the fused kernel does, rounds it once to BF16 and stores it
// in w [2^DEPTH, M, N] (row-major); leaf_merge_kernel applies the BF16 merges. Same instructions
// per leaf and the same roundings as tree_gemm_kernel, so the same bits; 2^DEPTH times the blocks.
__global__ void __launch_bounds__(TB_THREADS) tree_leaf_kernel(TreeArgs g, bf16* w) {
    __shared__ TreeSmem sm;
    const int warp = threadIdx.x >> 5;
    const int wm = warp / 4;
    const int wn = warp % 4;
    const int64_t m0 = static_cast<int64_t>(blockIdx.x) * TB_M;
    const int64_t n0 = static_cast<int64_t>(blockIdx.y) * TB_N;
    const int leaf = static_cast<int>(blockIdx.z);
    FragC acc[FM][FN];
    tree_leaf(acc, sm, g, m0, n0, g.bounds[leaf], g.bounds[leaf + 1], wm, wn);
    LeafBf16 res;
    round_leaf(res, acc);
    TreeArgs out = g;
    out.c = w + static_cast<int64_t>(leaf) * g.M * g.N;
    out.s_cm = g.N;
    out.s_cn = 1;
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            FragC frag;
#pragma unroll
            for (int e = 0; e < FRAG_ELEMS; ++e) frag.x[e] = f32(res.v[i][j][e]);
            store_fragment<false>(sm, out, frag, m0 + wm * TB_WARP_M + i * 16, n0 + wn * TB_WARP_N + j * 16);
        }
}

// Decode form of a leaf (M <= GV_M, the weight streamed once): block (tile_n, leaf) owns rows
// [0, M) x columns [n0, n0 + GV_N) of one leaf; each of its 4 warps owns the MF = ceil(M / 16)
// 16 x 16 accumulator fragments of one 16-column strip and runs exactly the fused kernel's leaf
// loop for each: 32-wide K steps from the leaf's
// first index in increasing k, each two wmma::mma_sync of 16 k (the same fragment types, so the
// same HMMA instructions), the tail step zero-padded past the leaf's end, no step past the leaf's
// last, one rounding to BF16 (or the FP32 sum itself for the FP32-output GEMM). Only the way
// operands reach shared memory differs: cp.async 16-byte copies into a ring of STAGES slots of
// KS steps each (dynamic shared memory, GvRing), so several 16 KB slices of the weight are in flight per
// block (the fused kernel loads one 32-wide step at a time and is latency-bound at M = 1; a ring of
// single steps reached only 0.39 of copy bandwidth on the H200). Needs unit stride along K for both
// operands, 16-byte aligned rows and leaf bounds that are multiples of 8 (the host checks;
// otherwise the generic leaf kernel runs). Rows past M are zero-filled.
constexpr int GV_M = 64;  // rows: MF = 1, 2 or 4 fragments per warp
constexpr int GV_N = 64;
constexpr int GV_THREADS = 128;

// Ring geometry: KS 32-wide K steps per slot, STAGES slots. The geometry only decides how many bytes
// of the weight are in flight and how many blocks fit an SM (shared memory); every variant runs the
// same 32-wide steps in the same order with the same WMMA instructions, so the bits are the same
// (tested, in the host emulation and on the H200). GV_VARIANTS lists the ones the library has;
// rl_gemv_variant picks one for the process (the sweep tool; the default is variant 0).
template <int KS, int STAGES, int MF>
struct GvRing {
    static constexpr int ROWS = 16 * MF;             // A rows of a slot
    static constexpr int SK = KS * TB_K;             // K width of a slot
    static constexpr int LD = SK + 8;                // smem row stride (elements): a multiple of 8
    static constexpr int SLOT = (ROWS + GV_N) * LD;  // elements per slot: A rows, then B rows
    static constexpr size_t SMEM = static_cast<size_t>(STAGES) * SLOT * sizeof(bf16);
};

// Issue the copies of slot s: K range [k0, k0 + SK), elements at or past hi zero-filled.
template <typename R>
__device__ __forceinline__ void gemv_issue(bf16* ring, int s, const TreeArgs& g, int64_t n0, int64_t k0, int64_t hi) {
    constexpr int VPR = R::SK / 8;  // 16-byte chunks per row of a slot
    bf16* slot = ring + static_cast<int64_t>(s) * R::SLOT;
    for (int v = threadIdx.x; v < (R::ROWS + GV_N) * VPR; v += GV_THREADS) {
        const int r = v / VPR;
        const int kc = (v % VPR) * 8;
        const int64_t gk = k0 + kc;
        const int64_t left = hi - gk;
        const int bytes = left >= 8 ? 16 : (left > 0 ? static_cast<int>(left) * 2 : 0);
        bf16* dst = slot + r * R::LD + kc;
        if (r < R::ROWS) {
            const bool ok = r < g.M && bytes;
            cp_async16(dst, ok ? g.a + r * g.s_am + gk : g.a, ok ? bytes : 0);
        } else {
            const int64_t n = n0 + (r - R::ROWS);
            const bool ok = n < g.N && bytes;
            cp_async16(dst, ok ? g.b + n * g.s_bn + gk : g.b, ok ? bytes : 0);
        }
    }
}

// The same copies as gemv_issue with each thread's source rows worked out once per block: 128 is
// a multiple of the chunks per row, so a thread always copies chunk column kc of rows r0 + RSTEP i,
// and a slot only adds its K position (the same bytes land in the same places).
template <typename R>
struct GvSources {
    static constexpr int VPR = R::SK / 8;
    static_assert(GV_THREADS % VPR == 0, "a thread keeps one chunk column");
    static constexpr int RSTEP = GV_THREADS / VPR;
    static constexpr int NI = (R::ROWS + GV_N + RSTEP - 1) / RSTEP;
    const bf16* src[NI];  // row base + kc; nullptr: a row past M or N (zero-filled)
    int kc;

    __device__ __forceinline__ GvSources(const TreeArgs& g, int64_t n0) {
        kc = (threadIdx.x % VPR) * 8;
        const int r0 = threadIdx.x / VPR;
#pragma unroll
        for (int i = 0; i < NI; ++i) {
            const int r = r0 + RSTEP * i;
            const bf16* p = nullptr;
            if (r < R::ROWS) {
                if (r < g.M) p = g.a + r * g.s_am + kc;
            } else if (r < R::ROWS + GV_N) {
                const int64_t n = n0 + (r - R::ROWS);
                if (n < g.N) p = g.b + n * g.s_bn + kc;
            }
            src[i] = p;
        }
    }

    __device__ __forceinline__ void issue(bf16* ring, int s, const TreeArgs& g, int64_t k0, int64_t hi) const {
        bf16* slot = ring + static_cast<int64_t>(s) * R::SLOT + kc;
        const int64_t left = hi - (k0 + kc);
        const int bytes = left >= 8 ? 16 : (left > 0 ? static_cast<int>(left) * 2 : 0);
        const int r0 = threadIdx.x / VPR;
#pragma unroll
        for (int i = 0; i < NI; ++i) {
            const int r = r0 + RSTEP * i;
            if (r >= R::ROWS + GV_N) break;
            const bool ok = src[i] != nullptr && bytes;
            cp_async16(slot + r * R::LD, ok ? src[i] + k0 : g.a, ok ? bytes : 0);
        }
    }
};

struct GvNoSources {
    __device__ __forceinline__ GvNoSources(const TreeArgs&, int64_t) {}
};

template <bool OUT_F32, int KS, int STAGES, int MF, bool PRE = false>
__global__ void __launch_bounds__(GV_THREADS) gemv_leaf_kernel(TreeArgs g, void* out, int64_t s_om, int64_t s_on) {
    using R = GvRing<KS, STAGES, MF>;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* ring = reinterpret_cast<bf16*>(smem_raw);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * GV_N;
    const int leaf = static_cast<int>(blockIdx.y);
    const int64_t lo = g.bounds[leaf];
    const int64_t hi = g.bounds[leaf + 1];
    const int64_t steps = cdiv(hi - lo, TB_K);   // the fused kernel's 32-wide steps
    const int64_t slots = cdiv(steps, KS);
    const typename std::conditional<PRE, GvSources<R>, GvNoSources>::type srcs(g, n0);
    FragC acc[MF];
#pragma unroll
    for (int f = 0; f < MF; ++f) wmma::fill_fragment(acc[f], 0.0f);
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slots) {
            if constexpr (PRE) srcs.issue(ring, s, g, lo + s * R::SK, hi);
            else gemv_issue<R>(ring, s, g, n0, lo + s * R::SK, hi);
        }
        cp_async_commit();
    }
    for (int64_t i = 0; i < slots; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // slot i has landed for every thread; slot i - 1 is free again
        const int64_t nxt = i + STAGES - 1;
        if (nxt < slots) {
            if constexpr (PRE) srcs.issue(ring, static_cast<int>(nxt % STAGES), g, lo + nxt * R::SK, hi);
            else gemv_issue<R>(ring, static_cast<int>(nxt % STAGES), g, n0, lo + nxt * R::SK, hi);
        }
        cp_async_commit();
        const bf16* slot = ring + (i % STAGES) * R::SLOT;
#pragma unroll
        for (int j = 0; j < KS; ++j) {
            if (i * KS + j >= steps) break;  // the fused kernel runs no step past the leaf's last
#pragma unroll
            for (int kk = 0; kk < TB_K; kk += 16) {
                FragB fb;
                wmma::load_matrix_sync(fb, slot + (R::ROWS + warp * 16) * R::LD + j * TB_K + kk, R::LD);
#pragma unroll
                for (int f = 0; f < MF; ++f) {
                    FragA fa;
                    wmma::load_matrix_sync(fa, slot + f * 16 * R::LD + j * TB_K + kk, R::LD);
                    wmma::mma_sync(acc[f], fa, fb, acc[f]);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring before the staging area (aliased) is written
    float* st = reinterpret_cast<float*>(smem_raw) + warp * 256;
#pragma unroll
    for (int f = 0; f < MF; ++f) {
        wmma::store_matrix_sync(st, acc[f], 16, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            const int64_t r = f * 16 + e / 16;
            const int64_t c = n0 + warp * 16 + e % 16;
            if (r < g.M && c < g.N) {
                if (OUT_F32) {
                    static_cast<float*>(out)[r * s_om + c * s_on] = st[e];
                } else {
                    static_cast<bf16*>(out)[leaf * g.M * g.N + r * s_om + c * s_on] = to_bf16(st[e]);
                }
            }
        }
        __syncwarp();  // the staging area is read before the next fragment overwrites it
    }
}

template <bool OUT_F32, int KS, int STAGES, int MF, bool PRE>
int launch_gemv_rows(const TreeArgs& g, int leaves, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    constexpr size_t smem = GvRing<KS, STAGES, MF>::SMEM;
    static_assert(smem >= GV_THREADS / 32 * 256 * sizeof(float), "the ring must hold the FP32 staging area");
    const cudaError_t e = cudaFuncSetAttribute(gemv_leaf_kernel<OUT_F32, KS, STAGES, MF, PRE>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
    dim3 grid(static_cast<unsigned>(cdiv(g.N, GV_N)), static_cast<unsigned>(leaves));
    gemv_leaf_kernel<OUT_F32, KS, STAGES, MF, PRE><<<grid, GV_THREADS, smem, st>>>(g, out, s_om, s_on);
    return launch_status();
}

// The fragment rows MF from M (a speed choice; every fragment runs the same steps whatever MF).
template <bool OUT_F32, int KS, int STAGES, bool PRE = false>
int launch_gemv_ring(const TreeArgs& g, int leaves, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    if (g.M <= 16) return launch_gemv_rows<OUT_F32, KS, STAGES, 1, PRE>(g, leaves, out, s_om, s_on, st);
    if (g.M <= 32) return launch_gemv_rows<OUT_F32, KS, STAGES, 2, PRE>(g, leaves, out, s_om, s_on, st);
    return launch_gemv_rows<OUT_F32, KS, STAGES, 4, PRE>(g, leaves, out, s_om, s_on, st);
}

// Tile form of the decode GEMV for batches of sequences (gemv_tile_kernel; variants 6 .. 8). On the
// H200 the ring kernel above is bound by its instruction count at M = 64: wmma::load_matrix_sync on
// a generic pointer compiles to scalar LDS / LD, and the copy addresses are recomputed per slot;
// it executed 35.5 M instructions for the gate/up product where Triton's kernel for the same grid
// executed 11.3 M and streamed twice as fast (ncu, evidence/2026-12-02-h200-decode-f6bcfa5).
// Here a block of WARPS warps owns WN WARPS columns of one leaf and each warp a 16 MF x WN tile:
//   * per 32-wide step a warp loads its A rows (2 MF ldmatrix.x4) and its weight rows (WN / 8
//     ldmatrix.x4) once and issues 2 MF WN / 8 mma.sync m16n8k16 from them;
//   * each thread's copies are worked out once per block: a thread always copies the same 16-byte
//     chunk column kc of rows r0 + 16 i (A rows, then weight rows), so a slot only adds its K
//     position to a pointer worked out at the start, and its shared-memory places are constants;
//   * the K loop is the fused kernel's leaf loop: 32-wide steps from the leaf's first index in
//     increasing k, each two MMAs of 16 k (k 0..15, then 16..31), zero-filled past the leaf's end
//     (a leaf's bounds are multiples of 8, so a copy lies wholly inside or outside it), no step past
//     its last; every output element is one accumulator fed by the same HMMA instructions in the
//     same order as WMMA's 16x16x16 tiles (the warp GEMV's argument), so the same FP32 sums; then
//     one rounding to BF16 into the leaf workspace (leaf_merge_kernel merges), or the FP32 sum
//     itself for the FP32-output GEMM (one leaf);
//   * a ring slot holds 64 k (two steps) of the 16 MF A rows and the weight rows; STAGES slots,
//     STAGES - 1 in flight while the block multiplies the oldest. Row stride 144 bytes: the eight
//     rows of an 8 x 8 ldmatrix fall in distinct banks.
// Needs what the ring kernel needs (gemv_ok). The geometry (WARPS, STAGES, WN) changes which warp
// computes which columns and how far ahead copies run, never a step, its order or an instruction.
constexpr int GT_SK = 2 * TB_K;   // k per ring slot
constexpr int GT_LD = GT_SK + 8;  // row stride of a slot (elements)
constexpr int GT_CHUNKS = GT_SK / 8;

template <int WARPS, int STAGES, int WN, int MF>
struct GtRing {
    static constexpr int ROWS = 16 * MF;                  // A rows of a slot
    static constexpr int COLS = WN * WARPS;               // weight rows (output columns) of a slot
    static constexpr int SLOT = (ROWS + COLS) * GT_LD;    // elements: A rows, then weight rows
    static constexpr size_t SMEM = static_cast<size_t>(STAGES) * SLOT * sizeof(bf16);
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int RSTEP = THREADS / GT_CHUNKS;     // rows between a thread's copies
    static constexpr int NCOPY = (ROWS + COLS) / RSTEP;   // copies per thread per slot
    static_assert(THREADS % GT_CHUNKS == 0 && (ROWS + COLS) % RSTEP == 0 && ROWS % RSTEP == 0,
                  "every thread copies whole rows of one chunk column");
};

template <bool OUT_F32, int WARPS, int STAGES, int WN, int MF>
__global__ void __launch_bounds__(GtRing<WARPS, STAGES, WN, MF>::THREADS)
    gemv_tile_kernel(TreeArgs g, void* out, int64_t s_om, int64_t s_on) {
    using R = GtRing<WARPS, STAGES, WN, MF>;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* ring = reinterpret_cast<bf16*>(smem_raw);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * R::COLS;
    const int leaf = static_cast<int>(blockIdx.y);
    const int64_t lo = g.bounds[leaf];
    const int64_t width = g.bounds[leaf + 1] - lo;
    const int64_t steps = cdiv(width, static_cast<int64_t>(TB_K));
    const int64_t slots = cdiv(width, static_cast<int64_t>(GT_SK));

    // This thread's copies: chunk column kc of rows r0 + RSTEP i (i < ROWS / RSTEP: A rows). The
    // ring's GvSources does the same for its geometry; its partial-chunk byte counts and row-tail
    // checks, which this form's geometry never needs, made this kernel about a quarter longer in SASS
    // when it was shared (2944 against 2376 instructions), so this form keeps its own copy plan.
    const int kc = (threadIdx.x % GT_CHUNKS) * 8;
    const int r0 = threadIdx.x / GT_CHUNKS;
    const bf16* src[R::NCOPY];  // nullptr: a row past M or N (zero-filled)
#pragma unroll
    for (int i = 0; i < R::NCOPY; ++i) {
        const int r = r0 + R::RSTEP * i;
        const bf16* p = nullptr;
        if (r < R::ROWS) {
            if (r < g.M) p = g.a + r * g.s_am + lo + kc;
        } else {
            const int64_t n = n0 + (r - R::ROWS);
            if (n < g.N) p = g.b + n * g.s_bn + lo + kc;
        }
        src[i] = p;
    }
    bf16* dst0 = ring + r0 * GT_LD + kc;
    auto issue = [&](int64_t s) {  // slot s: k in [lo + s GT_SK, + GT_SK)
        bf16* dst = dst0 + (s % STAGES) * R::SLOT;
        const bool in = s * GT_SK + kc < width;  // offset inside the leaf
#pragma unroll
        for (int i = 0; i < R::NCOPY; ++i) {
            const bool ok = in && src[i] != nullptr;
            cp_async16(dst + R::RSTEP * i * GT_LD, ok ? src[i] + s * GT_SK : g.a, ok ? 16 : 0);
        }
    };

    float acc[MF][WN / 8][4];
#pragma unroll
    for (int f = 0; f < MF; ++f)
#pragma unroll
        for (int j = 0; j < WN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[f][j][e] = 0.0f;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < slots) issue(s);
        cp_async_commit();
    }
    // ldmatrix row addresses: A (16 x 16 of a k half): lanes 0..15 rows 0..15 at k 0, lanes 16..31
    // the same rows at k 8; weights (8 rows x 32 k): lanes 8q .. 8q + 7 rows 0..7 at k 8q.
    const int arow = lane & 15;
    const int akof = (lane >> 4) * 8;
    const int brow = lane & 7;
    const int bkof = (lane >> 3) * 8;
    for (int64_t i = 0; i < slots; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // slot i has landed for every thread; slot i - 1 is free again
        if (i + STAGES - 1 < slots) issue(i + STAGES - 1);
        cp_async_commit();
        const bf16* slot = ring + (i % STAGES) * R::SLOT;
        const bf16* wrows = slot + (R::ROWS + warp * WN) * GT_LD;
#pragma unroll
        for (int q = 0; q < GT_SK / TB_K; ++q) {
            if (i * (GT_SK / TB_K) + q >= steps) break;  // uniform: no step past the leaf's last
            uint32_t a[MF][2][4];
#pragma unroll
            for (int f = 0; f < MF; ++f)
#pragma unroll
                for (int c = 0; c < 2; ++c) ldsm_x4(a[f][c], slot + (16 * f + arow) * GT_LD + q * TB_K + 16 * c + akof);
#pragma unroll
            for (int j = 0; j < WN / 8; ++j) {
                uint32_t b[4];  // k 0..7, 8..15 (first MMA), 16..23, 24..31 (second) of weight rows 8j .. 8j + 7
                ldsm_x4(b, wrows + (8 * j + brow) * GT_LD + q * TB_K + bkof);
                const uint32_t b0[2] = {b[0], b[1]};
                const uint32_t b1[2] = {b[2], b[3]};
#pragma unroll
                for (int f = 0; f < MF; ++f) {
                    mma_bf16_16816(acc[f][j], a[f][0], b0);
                    mma_bf16_16816(acc[f][j], a[f][1], b1);
                }
            }
        }
    }
    cp_async_wait<0>();
    const int gq = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int f = 0; f < MF; ++f)
#pragma unroll
        for (int j = 0; j < WN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t r = 16 * f + gq + 8 * (e >> 1);
                const int64_t c = n0 + warp * WN + 8 * j + 2 * t + (e & 1);
                if (r < g.M && c < g.N) {
                    if (OUT_F32) {
                        static_cast<float*>(out)[r * s_om + c * s_on] = acc[f][j][e];
                    } else {
                        static_cast<bf16*>(out)[leaf * g.M * g.N + r * s_om + c * s_on] = to_bf16(acc[f][j][e]);
                    }
                }
            }
}

template <bool OUT_F32, int WARPS, int STAGES, int WN, int MF>
int launch_gemv_tile_rows(const TreeArgs& g, int leaves, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    using R = GtRing<WARPS, STAGES, WN, MF>;
    const cudaError_t e = cudaFuncSetAttribute(gemv_tile_kernel<OUT_F32, WARPS, STAGES, WN, MF>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(R::SMEM));
    if (e != cudaSuccess) return static_cast<int>(e);
    dim3 grid(static_cast<unsigned>(cdiv(g.N, static_cast<int64_t>(R::COLS))), static_cast<unsigned>(leaves));
    gemv_tile_kernel<OUT_F32, WARPS, STAGES, WN, MF><<<grid, R::THREADS, R::SMEM, st>>>(g, out, s_om, s_on);
    return launch_status();
}

// The A rows MF from M (a speed choice; every fragment runs the same steps whatever MF).
template <bool OUT_F32, int WARPS, int STAGES, int WN>
int launch_gemv_tile(const TreeArgs& g, int leaves, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    if (g.M <= 16) return launch_gemv_tile_rows<OUT_F32, WARPS, STAGES, WN, 1>(g, leaves, out, s_om, s_on, st);
    if (g.M <= 32) return launch_gemv_tile_rows<OUT_F32, WARPS, STAGES, WN, 2>(g, leaves, out, s_om, s_on, st);
    return launch_gemv_tile_rows<OUT_F32, WARPS, STAGES, WN, 4>(g, leaves, out, s_om, s_on, st);
}

// Warpgroup form of the decode GEMV (gemv_wgmma_kernel; the GPU only, variants 9 .. 11): one
// warpgroup (four warps) per block owns all 64 rows of A (zero-filled past M) and 64 weight rows
// (output columns) of one leaf, and multiplies with the Hopper warpgroup MMA (wgmma.mma_async
// m64n64k16: BF16 operands read from shared memory through matrix descriptors, FP32 accumulators in
// registers) in place of ldmatrix + mma.sync.
//   * The K loop is the fused kernel's leaf loop: 32-wide steps from the leaf's first index in
//     increasing k, each two products of 16 k (k 0..15, then 16..31), zero-filled past the leaf's
//     end, no step past its last; every output element is one FP32 accumulator that takes one k16
//     product per instruction in increasing k. The warpgroup instruction rounds that chain as the
//     HMMA of mma.sync does (tested on the H200 at 3666133 and by the GPU tests of every variant).
//   * A ring slot holds 64 k (two steps) of the 64 A rows (bytes [0, 8192)) and the 64 weight rows
//     ([8192, 16384)), one 128-byte row per row, in the 128-byte-swizzle K-major layout of the PTX
//     ISA (the layout Triton gives its wgmma operands): 16-byte chunk j of row r sits at chunk
//     j ^ (r % 8) of the row; the descriptor's stride between 8-row groups is 1024 bytes, and k16
//     product c starts 32 c bytes into the row. (The no-swizzle layout of 3666133 gave the same
//     bits at a fifth of copy bandwidth on the H200.)
//   * Copies: thread t copies chunk kc = t % 8 of rows t / 8 + 16 i (i < 4: A, i >= 4: weights), so
//     eight threads fill one 128-byte row; a slot only adds its K position to source pointers and a
//     shared offset worked out once per block.
//   * Pipeline: after a slot's four MMAs are issued, a thread waits for the MMAs of the slot before
//     (wgmma.wait_group 1) and, after a barrier, refills that slot's ring place with cp.async, so the
//     tensor cores of one slot overlap the copy issue of the next.
//   * MERGE = 0: the leaf is rounded to BF16 into the workspace (the merge launch follows). MERGE =
//     2 or 4: the leaves of the same 64 columns are one thread-block cluster (1 x MERGE); each block
//     rounds its leaf to BF16 into its own shared memory, and after a cluster barrier block `leaf`
//     applies the contract's merges, bf16(fp32(l0) + fp32(l1)) and ((l0 + l1) + (l2 + l3)), to rows
//     [leaf 64 / MERGE, (leaf + 1) 64 / MERGE), reading the other leaves through distributed shared
//     memory: the merge kernel's expressions without its launch and workspace.
// Needs what the ring kernel needs (gemv_ok).
constexpr int WG_SK = 2 * TB_K;          // k per ring slot
constexpr int WG_ROWS = 64;              // A rows and weight rows of a slot
constexpr int WG_A_BYTES = WG_ROWS * WG_SK * 2;
constexpr int WG_SLOT = 2 * WG_A_BYTES;  // bytes per slot
constexpr int WG_MERGE_LD = WG_ROWS + 8; // row stride (elements) of a block's BF16 leaf in the merge

template <int STAGES>
constexpr size_t wg_smem() { return static_cast<size_t>(STAGES) * WG_SLOT; }

#ifndef RL_HOST_EMU
__device__ __forceinline__ void cluster_sync_all() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// The address of the same shared-memory byte in block `rank` of the cluster (mapa), and a 16-byte
// load from it.
__device__ __forceinline__ uint4 ld_cluster16(uint32_t local, int rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(rank));
    uint4 v;
    asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(remote)
                 : "memory");
    return v;
}

// d[32] += A (64 x 16, descriptor da) @ B (16 x 64, K-major descriptor db), FP32 accumulation
// (gemm.cuh's wgmma_ss_n64, accumulating).
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t da, uint64_t db) { wgmma_ss_n64(d, da, db, 1); }

template <bool OUT_F32, int STAGES, int MERGE>
__global__ void __launch_bounds__(128) gemv_wgmma_kernel(TreeArgs g, void* out, int64_t s_om, int64_t s_on,
                                                          int early_weights) {
    static_assert(MERGE == 0 || MERGE == 2 || MERGE == 4, "merge over 2 or 4 leaves");
    static_assert(!(OUT_F32 && MERGE), "FP32 output has one leaf");
    extern __shared__ __align__(1024) unsigned char smem_raw[];  // the swizzle needs 1024-byte slots
    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    const int64_t n0 = static_cast<int64_t>(blockIdx.x) * WG_ROWS;
    const int leaf = static_cast<int>(blockIdx.y);
    const int64_t lo = g.bounds[leaf];
    const int64_t width = g.bounds[leaf + 1] - lo;
    const int64_t steps = cdiv(width, static_cast<int64_t>(TB_K));
    const int64_t slots = cdiv(width, static_cast<int64_t>(WG_SK));

    // This thread's copies (see above): sources of its eight rows, a bit per row inside M or N.
    const int kc = tid & 7;
    const int r0 = tid >> 3;
    const uint32_t ring = smem_u32(smem_raw);
    if (ring & 1023u) __trap();  // never taken on the H200 (dynamic shared memory starts aligned)
    const uint32_t dst0 = ring + r0 * 128 + ((kc ^ (r0 & 7)) << 4);  // + 2048 i for row r0 + 16 i
    const bf16* src[8];
    unsigned rows_in = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = r0 + 16 * (i & 3);
        const bf16* p = g.a;
        if (i < 4) {
            if (r < g.M) p = g.a + r * g.s_am + lo + 8 * kc, rows_in |= 1u << i;
        } else if (n0 + r < g.N) {
            p = g.b + (n0 + r) * g.s_bn + lo + 8 * kc, rows_in |= 1u << i;
        }
        src[i] = p;
    }
    // Copies of slot s (k in [lo + 64 s, + 64)) into ring slot q: rows i in [I0, I1) of this thread.
    auto issue_rows = [&](int64_t s, int q, auto i0, auto i1) {
        const uint32_t d = dst0 + q * WG_SLOT;
        const int64_t off = s * WG_SK;
        const bool in = off + 8 * kc < width;  // offset inside the leaf (bounds are multiples of 8)
#pragma unroll
        for (int i = decltype(i0)::value; i < decltype(i1)::value; ++i) {
            const bool ok = in && ((rows_in >> i) & 1u);
            cp_async16_s(d + 2048 * i, ok ? src[i] + off : g.a, ok ? 16 : 0);
        }
    };
    using I0 = std::integral_constant<int, 0>;
    using I4 = std::integral_constant<int, 4>;
    using I8 = std::integral_constant<int, 8>;
    auto issue = [&](int64_t s, int q) { issue_rows(s, q, I0{}, I8{}); };

    float acc[32];
#pragma unroll
    for (int e = 0; e < 32; ++e) acc[e] = 0.0f;
    // PDL (common.cuh): with early_weights the first slots' weight rows are copied before the wait
    // (mode 2: nothing writes a weight during a decode step); A, the previous kernel's output, after.
    if (early_weights) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s)
            if (s < slots) issue_rows(s, s, I4{}, I8{});
    }
    pdl_wait();
    pdl_launch_dependents();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {  // group s holds slot s's A rows (and its weight rows)
        if (s < slots) {
            if (early_weights) issue_rows(s, s, I0{}, I4{});
            else issue(s, s);
        }
        cp_async_commit();
    }
    const uint64_t desc0 = wg_desc_sw128(ring);
    int q = 0;              // ring slot of slot i
    int qn = STAGES - 1;    // ring slot of slot i + STAGES - 1 (that of slot i - 1)
    for (int64_t i = 0; i < slots; ++i) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();      // slot i has landed for every thread
        fence_proxy_async();  // ... and is visible to the warpgroup MMA's reads
        const uint64_t da = desc0 + static_cast<uint64_t>((q * WG_SLOT) >> 4);
        const uint64_t db = da + (WG_A_BYTES >> 4);
        // step 2 i (k 0..15, 16..31: 32 bytes on), then step 2 i + 1 unless the leaf ends before it
        // (uniform); each branch commits its own group (gemm_tw.cuh's tw_slot_mmas says why)
        if (2 * i + 1 < steps) {
            wg_fence();
            wgmma_n64(acc, da, db);
            wgmma_n64(acc, da + 2, db + 2);
            wgmma_n64(acc, da + 4, db + 4);
            wgmma_n64(acc, da + 6, db + 6);
            wg_commit();
        } else {
            wg_fence();
            wgmma_n64(acc, da, db);
            wgmma_n64(acc, da + 2, db + 2);
            wg_commit();
        }
        wg_wait1();       // this warp's MMAs of slot i - 1 have completed
        __syncthreads();  // ... every warp's: its ring place takes slot i + STAGES - 1
        if (i + STAGES - 1 < slots) issue(i + STAGES - 1, qn);
        cp_async_commit();
        q = q + 1 == STAGES ? 0 : q + 1;
        qn = qn + 1 == STAGES ? 0 : qn + 1;
    }
    wg_wait0();
    cp_async_wait<0>();
    const int gq = lane >> 2;
    const int t = lane & 3;
    if constexpr (MERGE == 0) {
#pragma unroll
        for (int j = 0; j < WG_ROWS / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t r = 16 * warp + gq + 8 * (e >> 1);
                const int64_t c = n0 + 8 * j + 2 * t + (e & 1);
                if (r < g.M && c < g.N) {
                    if (OUT_F32) {
                        static_cast<float*>(out)[r * s_om + c * s_on] = acc[4 * j + e];
                    } else {
                        static_cast<bf16*>(out)[leaf * g.M * g.N + r * s_om + c * s_on] = to_bf16(acc[4 * j + e]);
                    }
                }
            }
    } else {
        (void)out, (void)s_om, (void)s_on;
        __syncthreads();  // every warp is past its last MMA: the ring's first bytes take the leaf
        bf16* lb = reinterpret_cast<bf16*>(smem_raw);
#pragma unroll
        for (int j = 0; j < WG_ROWS / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = 16 * warp + gq + 8 * h;
                __nv_bfloat162 v;
                v.x = to_bf16(acc[4 * j + 2 * h]);
                v.y = to_bf16(acc[4 * j + 2 * h + 1]);
                *reinterpret_cast<__nv_bfloat162*>(lb + r * WG_MERGE_LD + 8 * j + 2 * t) = v;
            }
        cluster_sync_all();  // every leaf of these columns is in its block's shared memory
        constexpr int RB = WG_ROWS / MERGE;  // rows this block merges
        bf16* c = static_cast<bf16*>(g.c);
        for (int v = tid; v < RB * (WG_ROWS / 8); v += 128) {
            const int r = leaf * RB + v / (WG_ROWS / 8);
            const int c8 = 8 * (v % (WG_ROWS / 8));
            const uint32_t local = smem_u32(lb + r * WG_MERGE_LD + c8);
            uint4 x[MERGE];
#pragma unroll
            for (int l = 0; l < MERGE; ++l) x[l] = ld_cluster16(local, l);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                bf16 p[MERGE];
#pragma unroll
                for (int l = 0; l < MERGE; ++l) p[l] = reinterpret_cast<const bf16*>(&x[l])[e];
                bf16 s = to_bf16(f32(p[0]) + f32(p[1]));
                if constexpr (MERGE == 4) {
                    const bf16 s23 = to_bf16(f32(p[2]) + f32(p[3]));
                    s = to_bf16(f32(s) + f32(s23));
                }
                const int64_t col = n0 + c8 + e;
                if (r < g.M && col < g.N) c[r * g.s_cm + col * g.s_cn] = s;
            }
        }
        cluster_sync_all();  // no block exits while another still reads its shared memory
    }
}
#endif

template <bool OUT_F32, int STAGES, int MERGE>
int launch_gemv_wgmma(const TreeArgs& g, int leaves, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
#ifdef RL_HOST_EMU
    (void)g, (void)leaves, (void)out, (void)s_om, (void)s_on, (void)st;
    return static_cast<int>(cudaErrorNotSupported);  // the host emulation has no warpgroup MMA or clusters
#else
    if (MERGE && leaves != MERGE) return static_cast<int>(cudaErrorInvalidValue);
    auto kernel = gemv_wgmma_kernel<OUT_F32, STAGES, MERGE>;
    const int smem = static_cast<int>(wg_smem<STAGES>());
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return static_cast<int>(e);
    const dim3 grid(static_cast<unsigned>(cdiv(g.N, static_cast<int64_t>(WG_ROWS))), static_cast<unsigned>(leaves));
    cudaLaunchAttribute attr[2];
    unsigned n_attr = 0;
    if (MERGE) {  // the leaves of the same columns: one cluster
        attr[n_attr].id = cudaLaunchAttributeClusterDimension;
        attr[n_attr].val.clusterDim.x = 1;
        attr[n_attr].val.clusterDim.y = static_cast<unsigned>(MERGE);
        attr[n_attr].val.clusterDim.z = 1;
        ++n_attr;
    }
    if (g_programmatic_launch) {  // PDL (common.cuh): the kernel keeps its rules
        attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
        ++n_attr;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = n_attr;
    return static_cast<int>(cudaLaunchKernelEx(&cfg, kernel, g, out, s_om, s_on,
                                               static_cast<int>(g_programmatic_launch && pdl_early_weights())));
#endif
}

// The warpgroup form with the leaf merge in a cluster where the output is BF16 leaves (sets
// *merged: the caller launches no merge), else the plain form.
template <bool OUT_F32, int STAGES>
int launch_gemv_wgmma_merged(const TreeArgs& g, int leaves, void* out, int64_t s_om, int64_t s_on, cudaStream_t st,
                             bool* merged) {
    if constexpr (!OUT_F32) {
        if (merged && (leaves == 2 || leaves == 4)) {
            *merged = true;
            return leaves == 2 ? launch_gemv_wgmma<false, STAGES, 2>(g, leaves, out, s_om, s_on, st)
                               : launch_gemv_wgmma<false, STAGES, 4>(g, leaves, out, s_om, s_on, st);
        }
    }
    return launch_gemv_wgmma<OUT_F32, STAGES, 0>(g, leaves, out, s_om, s_on, st);
}

// The ring variants (KS, STAGES) and shared memory per block at MF = 1 (the A rows grow with MF):
// 0 = (4, 2) 44 KB with each thread's copy sources worked out once per block (GvSources), the
// default; 1 = (2, 4) 46 KB; 2 = (2, 6) 69 KB; 3 = (1, 8) 51 KB; 4 = (4, 4) 87 KB; 5 = (4, 2) 44 KB
// with the sources recomputed per slot. On the H200 (evidence/2026-12-02-h200-decode-80982b6, where
// 0 and 5 were swapped) variant 0 was the fastest ring at every Qwen3-8B shape and M in {1, 16, 64}:
// at M = 64, 34.4 / 25.5 / 122.8 / 60.5 us for the q/k/v, o, gate/up and down products against
// 39.1 / 33.6 / 145.1 / 83.5 us for variant 5.
// 6 .. 8 are the tile form (gemv_tile_kernel) with (WARPS, STAGES, columns per warp) and shared
// memory per block at M = 64: 6 = (4, 4, 32) 110 KB (128 columns per block); 7 = (4, 4, 16) 74 KB
// (64 columns); 8 = (4, 6, 16) 110 KB.
// 9 .. 11 are the warpgroup form (gemv_wgmma_kernel, 64 columns per block, slots of 64 k, the GPU
// only): 9 = 4 slots (64 KB) and the merge launch; 10 = 4 slots with the leaf merge in a cluster;
// 11 = 6 slots (96 KB) with the leaf merge in a cluster.
constexpr int GV_VARIANTS = 12;
int g_gemv_variant = 0;

// Variant 0, the default, takes form GV_TILE_DEFAULT from GV_TILE_MIN_M rows up: a speed choice
// from M only, the same bits. On the H200 (evidence/2026-12-02-h200-decode-1d1a1ab)
// at M = 64 the tile form 6 took 32.1 / 21.3 / 101.8 / 43.9 us for the q/k/v, o, gate/up and down
// products (merge launch included) where the ring took 34.8 / 25.8 / 120.0 / 60.4; 7 and 8 were
// slower than 6. Since 58e7197 the warpgroup form (evidence/2026-12-02-h200-decode-9b35315):
// variant 10 at M = 64 took 23.1 / 13.5 / 69.4 / 31.0 us (tile form 6: 32.4 / 21.2 / 99.4 / 44.1)
// and the B = 64 step 8.99 ms against 11.25, so it is the default on the GPU; the host emulation
// has no warpgroup MMA and keeps the tile form (its tests compare every form with the fused kernel).
// From M = 8: Qwen3-8B graph steps with the warpgroup form from M = 1 against the warp GEMV below
// M = 17 (evidence/2026-12-02-h200-decode-9b35315): B = 8 6.48 against 7.09 ms, B = 16 context 1024
// 6.47 against 7.6, context 8192 11.52 against 12.32; B = 1 5.65 against 5.0 (the warp GEMV stays).
constexpr int64_t GV_TILE_MIN_M = 8;
#ifdef RL_HOST_EMU
constexpr int GV_TILE_DEFAULT = 6;
#else
constexpr int GV_TILE_DEFAULT = 10;
#endif
// The row count from which form GV_TILE_DEFAULT replaces the warp GEMV and the ring (rl_gemv_tile_min_m
// changes it for the process: the decode-profile tool's step-level comparison; the same bits).
int64_t g_gemv_tile_min_m = GV_TILE_MIN_M;

// `merged` (BF16 leaves only): set when the variant applied the leaf merges itself and stored C.
template <bool OUT_F32>
int launch_gemv(const TreeArgs& g, int leaves, void* out, int64_t s_om, int64_t s_on, cudaStream_t st,
                bool* merged = nullptr) {
    int v = g_gemv_variant;
    if (v == 0 && g.M >= g_gemv_tile_min_m) v = GV_TILE_DEFAULT;
    switch (v) {
        case 1: return launch_gemv_ring<OUT_F32, 2, 4>(g, leaves, out, s_om, s_on, st);
        case 2: return launch_gemv_ring<OUT_F32, 2, 6>(g, leaves, out, s_om, s_on, st);
        case 3: return launch_gemv_ring<OUT_F32, 1, 8>(g, leaves, out, s_om, s_on, st);
        case 4: return launch_gemv_ring<OUT_F32, 4, 4>(g, leaves, out, s_om, s_on, st);
        case 5: return launch_gemv_ring<OUT_F32, 4, 2>(g, leaves, out, s_om, s_on, st);
        case 6: return launch_gemv_tile<OUT_F32, 4, 4, 32>(g, leaves, out, s_om, s_on, st);
        case 7: return launch_gemv_tile<OUT_F32, 4, 4, 16>(g, leaves, out, s_om, s_on, st);
        case 8: return launch_gemv_tile<OUT_F32, 4, 6, 16>(g, leaves, out, s_om, s_on, st);
        case 9: return launch_gemv_wgmma<OUT_F32, 4, 0>(g, leaves, out, s_om, s_on, st);
        case 10: return launch_gemv_wgmma_merged<OUT_F32, 4>(g, leaves, out, s_om, s_on, st, merged);
        case 11: return launch_gemv_wgmma_merged<OUT_F32, 6>(g, leaves, out, s_om, s_on, st, merged);
        default: return launch_gemv_ring<OUT_F32, 4, 2, true>(g, leaves, out, s_om, s_on, st);
    }
}

// Warp-streamed decode form for M <= 16 (gemv_warp_kernel): each warp streams its own columns of
// one leaf through a private cp.async ring in shared memory (no barrier inside the K loop), and the
// block merges its leaves itself (no workspace, no merge launch).
//   * Block = GW_WARPS warps; warp w runs leaf w % LEAVES of columns [n0 + 8 NC (w / LEAVES), + 8 NC):
//     NC groups of 8 columns, each one 16 x 8 FP32 accumulator of mma.sync m16n8k16 (A rows >= M
//     are zero in shared memory and dropped at the store).
//   * The K loop is the fused kernel's leaf loop: 32-wide steps from the leaf's first index in
//     increasing k, each two MMAs of 16 k (k 0..15, then 16..31 of the step), zero-filled past the
//     leaf's end, no step past its last: the same HMMA instruction on the same products in the same
//     order as WMMA's 16x16x16 tiles, so the same FP32 sums (tested against the 128 x 128 kernel).
//   * A ring slot holds GW_SK = 128 k (four steps) of the warp's 8 NC weight rows and 8 XR
//     activation rows, 16-byte cp.async copies (zero-filled past the leaf's end or N); DEPTH slots,
//     DEPTH - 1 of them in flight while the warp multiplies the oldest. Fragments come from the ring
//     by ldmatrix (row stride 272 bytes: the eight rows of an 8 x 8 matrix fall in distinct banks).
//   * Leaves: each warp rounds its FP32 leaf to BF16 into shared memory; after one barrier the block
//     applies the contract's merges, bf16(fp32(l0) + fp32(l1)) and ((l0 + l1) + (l2 + l3)), and
//     stores C. With LEAVES = 1 and OUT_F32 the FP32 sums are stored as they are (lm_head logits).
// Needs what the ring kernel needs (gemv_ok): unit K stride, 16-byte aligned rows, leaf bounds that
// are multiples of 8 (so a 16-byte copy lies wholly inside or wholly outside the leaf).
constexpr int GW_WARPS = 4;
constexpr int GW_THREADS = GW_WARPS * 32;
constexpr int GW_SK = 4 * TB_K;  // k per ring slot
constexpr int GW_LD = GW_SK + 8; // row stride of a slot (elements)
constexpr int GW_M = 16;

template <int NC, int XR, int DEPTH>
struct GwRing {
    static constexpr int WROWS = 8 * NC;
    static constexpr int XROWS = 8 * XR;
    static constexpr int SLOT = (WROWS + XROWS) * GW_LD;  // elements: weight rows, then activation rows
    static constexpr size_t SMEM = static_cast<size_t>(GW_WARPS) * DEPTH * SLOT * sizeof(bf16);
};

template <int LEAVES, int NC, int XR, int DEPTH, bool OUT_F32>
__global__ void __launch_bounds__(GW_THREADS) gemv_warp_kernel(TreeArgs g, void* out, int64_t s_om, int64_t s_on,
                                                                 int early_w) {
    static_assert(GW_WARPS % LEAVES == 0 && (!OUT_F32 || LEAVES == 1), "FP32 output is the one-leaf GEMM");
    using R = GwRing<NC, XR, DEPTH>;
    constexpr int CPW = R::WROWS;                    // columns per warp
    constexpr int COLS = CPW * (GW_WARPS / LEAVES);  // columns per block
    constexpr int CHUNKS = GW_SK / 8;                // 16-byte chunks per row of a slot
    static_assert(32 % CHUNKS == 0, "a warp copies whole rows");
    constexpr int RPP = 32 / CHUNKS;                 // rows per pass of the warp's copies
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __shared__ bf16 leafs[LEAVES > 1 ? GW_WARPS : 1][GW_M][CPW];
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int leaf = warp % LEAVES;
    bf16* ring = reinterpret_cast<bf16*>(smem_raw) + warp * DEPTH * R::SLOT;
    const int64_t nw = static_cast<int64_t>(blockIdx.x) * COLS + (warp / LEAVES) * CPW;
    const int64_t lo = g.bounds[leaf];
    const int width = static_cast<int>(g.bounds[leaf + 1] - lo);  // the host checks that it fits
    const int steps = (width + TB_K - 1) / TB_K;
    const int slots = (width + GW_SK - 1) / GW_SK;

    // This lane's copies: chunk kc of rows rr + RPP i (weights), the same for the activation rows.
    const int kc = 8 * (lane % CHUNKS);
    const int rr = lane / CHUNKS;
    const bf16* wsrc[CPW / RPP];
    bool wok[CPW / RPP];
#pragma unroll
    for (int i = 0; i < CPW / RPP; ++i) {
        const int64_t n = nw + rr + RPP * i;
        wok[i] = n < g.N;
        wsrc[i] = g.b + (wok[i] ? n : 0) * g.s_bn + lo + kc;
    }
    const bf16* xsrc[R::XROWS / RPP];
    bool xok[R::XROWS / RPP];
#pragma unroll
    for (int i = 0; i < R::XROWS / RPP; ++i) {
        const int64_t m = rr + RPP * i;
        xok[i] = m < g.M;
        xsrc[i] = g.a + (xok[i] ? m : 0) * g.s_am + lo + kc;
    }
    // Activation rows at or past M are never copied: zero them once in every slot.
    for (int i = lane; i < DEPTH * R::XROWS * CHUNKS; i += 32) {
        const int slot = i / (R::XROWS * CHUNKS);
        const int m = (i / CHUNKS) % R::XROWS;
        if (m >= g.M) *reinterpret_cast<uint4*>(ring + slot * R::SLOT + (R::WROWS + m) * GW_LD + 8 * (i % CHUNKS)) =
                          make_uint4(0u, 0u, 0u, 0u);
    }
    auto issue_w = [&](int s) {  // slot s's weight rows
        bf16* slot = ring + (s % DEPTH) * R::SLOT;
        const bool in = s * GW_SK + kc < width;  // offset inside the leaf
#pragma unroll
        for (int i = 0; i < CPW / RPP; ++i) {
            const bool ok = wok[i] && in;
            cp_async16(slot + (rr + RPP * i) * GW_LD + kc, ok ? wsrc[i] + s * GW_SK : g.b, ok ? 16 : 0);
        }
    };
    auto issue_x = [&](int s) {  // slot s's activation rows
        bf16* slot = ring + (s % DEPTH) * R::SLOT;
        const int bytes = s * GW_SK + kc < width ? 16 : 0;
#pragma unroll
        for (int i = 0; i < R::XROWS / RPP; ++i)
            if (xok[i]) cp_async16(slot + (R::WROWS + rr + RPP * i) * GW_LD + kc, bytes ? xsrc[i] + s * GW_SK : g.a, bytes);
    };

    float acc[NC][4];
#pragma unroll
    for (int j = 0; j < NC; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    // With early_w (PDL mode 2, common.cuh) the first slots' weights are in flight before pdl_wait,
    // the activation rows after it. The weights join commit group 0 either way, so slot s is
    // complete once groups 0 .. s are, as in the loop below.
    if (early_w) {
#pragma unroll
        for (int s = 0; s < DEPTH - 1; ++s)
            if (s < slots) issue_w(s);
    }
    pdl_wait();
    pdl_launch_dependents();
    if (!early_w) {
#pragma unroll
        for (int s = 0; s < DEPTH - 1; ++s)
            if (s < slots) issue_w(s);
    }
#pragma unroll
    for (int s = 0; s < DEPTH - 1; ++s) {
        if (s < slots) issue_x(s);
        cp_async_commit();
    }
    // ldmatrix row addresses: lanes 8q .. 8q + 7 give the rows of matrix q.
    const int mrow = lane & 7;
    const int mq = lane >> 3;
    for (int s = 0; s < slots; ++s) {
        cp_async_wait<DEPTH - 2>();
        __syncwarp();  // slot s has landed for every lane; every lane is done with slot s - 1
        if (s + DEPTH - 1 < slots) {
            issue_w(s + DEPTH - 1);
            issue_x(s + DEPTH - 1);
        }
        cp_async_commit();
        const bf16* slot = ring + (s % DEPTH) * R::SLOT;
#pragma unroll
        for (int q = 0; q < GW_SK / TB_K; ++q) {
            if (s * (GW_SK / TB_K) + q >= steps) break;  // uniform: no step past the leaf's last
            uint32_t a[2][4];
            if (XR == 1) {  // rows 8..15 of A are zero: one x4 load gives a[c][0] and a[c][2] of both MMAs
                uint32_t r4[4];
                ldsm_x4(r4, slot + (R::WROWS + mrow) * GW_LD + q * TB_K + 8 * mq);
                a[0][0] = r4[0]; a[0][2] = r4[1]; a[1][0] = r4[2]; a[1][2] = r4[3];
                a[0][1] = a[0][3] = a[1][1] = a[1][3] = 0u;
            } else {
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    ldsm_x4(a[c], slot + (R::WROWS + mrow + 8 * (mq & 1)) * GW_LD + q * TB_K + 16 * c + 8 * (mq >> 1));
            }
#pragma unroll
            for (int j = 0; j < NC; ++j) {
                uint32_t b[4];  // k 0..7, 8..15 (first MMA), 16..23, 24..31 (second) of rows 8j .. 8j + 7
                ldsm_x4(b, slot + (8 * j + mrow) * GW_LD + q * TB_K + 8 * mq);
                const uint32_t b0[2] = {b[0], b[1]};
                const uint32_t b1[2] = {b[2], b[3]};
                mma_bf16_16816(acc[j], a[0], b0);
                mma_bf16_16816(acc[j], a[1], b1);
            }
        }
    }
    cp_async_wait<0>();

    const int gq = lane >> 2;
    const int t = lane & 3;
    if constexpr (LEAVES == 1) {
#pragma unroll
        for (int j = 0; j < NC; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t r = gq + 8 * (e >> 1);
                const int64_t c = nw + 8 * j + 2 * t + (e & 1);
                if (r < g.M && c < g.N) {
                    if (OUT_F32) {
                        static_cast<float*>(out)[r * s_om + c * s_on] = acc[j][e];
                    } else {
                        static_cast<bf16*>(out)[r * s_om + c * s_on] = to_bf16(acc[j][e]);
                    }
                }
            }
    } else {
#pragma unroll
        for (int j = 0; j < NC; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) leafs[warp][gq + 8 * (e >> 1)][8 * j + 2 * t + (e & 1)] = to_bf16(acc[j][e]);
        __syncthreads();
        constexpr int GROUPS = GW_WARPS / LEAVES;
        for (int i = threadIdx.x; i < GROUPS * GW_M * CPW; i += GW_THREADS) {
            const int grp = i / (GW_M * CPW);
            const int r = (i / CPW) % GW_M;
            const int cc = i % CPW;
            const int64_t c = static_cast<int64_t>(blockIdx.x) * COLS + grp * CPW + cc;
            if (r >= g.M || c >= g.N) continue;
            const int w0 = grp * LEAVES;
            bf16 sum = to_bf16(f32(leafs[w0][r][cc]) + f32(leafs[w0 + 1][r][cc]));
            if (LEAVES == 4) {
                const bf16 s23 = to_bf16(f32(leafs[w0 + 2][r][cc]) + f32(leafs[w0 + 3][r][cc]));
                sum = to_bf16(f32(sum) + f32(s23));
            }
            static_cast<bf16*>(out)[r * s_om + c * s_on] = sum;
        }
    }
}

template <int LEAVES, int NC, int XR, int DEPTH, bool OUT_F32>
int launch_gemv_warp_rows(const TreeArgs& g, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    constexpr int COLS = 8 * NC * (GW_WARPS / LEAVES);
    constexpr size_t smem = GwRing<NC, XR, DEPTH>::SMEM;
    const int64_t blocks = cdiv(g.N, COLS);
    if (blocks >= 2147483647LL) return static_cast<int>(cudaErrorInvalidValue);
    const cudaError_t e = cudaFuncSetAttribute(gemv_warp_kernel<LEAVES, NC, XR, DEPTH, OUT_F32>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return static_cast<int>(e);
    return launch_pdl(gemv_warp_kernel<LEAVES, NC, XR, DEPTH, OUT_F32>, dim3(static_cast<unsigned>(blocks)),
                      dim3(GW_THREADS), smem, st, g, out, s_om, s_on, static_cast<int>(pdl_early_weights()));
}

// One geometry: NC 8-column groups per warp, ring slots for M <= 8 (one 8-row block of A) and for
// M <= 16 (two).
template <int LEAVES, int NC, int DEPTH8, int DEPTH16, bool OUT_F32>
int launch_gemv_warp_geometry(const TreeArgs& g, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    if (g.M <= 8) return launch_gemv_warp_rows<LEAVES, NC, 1, DEPTH8, OUT_F32>(g, out, s_om, s_on, st);
    return launch_gemv_warp_rows<LEAVES, NC, 2, DEPTH16, OUT_F32>(g, out, s_om, s_on, st);
}

// The warp GEMV's geometries (NC, slots at M <= 8, slots at M <= 16), shared memory per block at
// M <= 8 and blocks per SM: 1 = (2, 3, 2) 77 KB (two); 2 = (2, 2, 2) 51 KB (four); 3 = (4, 3, 2)
// 128 KB (one, 32 columns per warp); 4 = (1, 6, 4) 102 KB (two, 8 columns per warp: twice the
// blocks); 5 = (2, 4, 3) 102 KB (two). The default, 0, takes 2's form at M <= 8 and 3's at M <= 16:
// the fastest warp forms on the H200 (evidence/2026-12-02-h200-decode-80982b6), at M = 1 16.4 /
// 12.4 / 54.1 / 29.5 us for the q/k/v, o, gate/up and down products (cuBLAS 16.4 / 13.4 / 48.1 /
// 29.6) and at M = 16 22.6 / 16.4 / 71.5 / 39.5 us. At tree depth 1 always 5 (the sweep is for the
// decode step's depth-2 products and logits; fewer instances to compile). They change which warp
// streams which bytes and how far ahead, never a step, its order or an instruction: the same bits
// (tested).
constexpr int GW_VARIANTS = 6;
int g_gemv_warp_variant = 0;

template <int LEAVES, bool OUT_F32>
int launch_gemv_warp(const TreeArgs& g, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    for (int i = 0; i <= LEAVES; ++i)
        if (g.bounds[i] - g.bounds[0] > 2147483647LL - GW_SK) return static_cast<int>(cudaErrorInvalidValue);
    if constexpr (LEAVES == 2) {  // tree depth 1 (a tensor-parallel rank's half of K): one geometry
        return launch_gemv_warp_geometry<LEAVES, 2, 4, 3, OUT_F32>(g, out, s_om, s_on, st);
    }
    switch (g_gemv_warp_variant) {
        case 1: return launch_gemv_warp_geometry<LEAVES, 2, 3, 2, OUT_F32>(g, out, s_om, s_on, st);
        case 2: return launch_gemv_warp_geometry<LEAVES, 2, 2, 2, OUT_F32>(g, out, s_om, s_on, st);
        case 3: return launch_gemv_warp_geometry<LEAVES, 4, 3, 2, OUT_F32>(g, out, s_om, s_on, st);
        case 4: return launch_gemv_warp_geometry<LEAVES, 1, 6, 4, OUT_F32>(g, out, s_om, s_on, st);
        case 5: return launch_gemv_warp_geometry<LEAVES, 2, 4, 3, OUT_F32>(g, out, s_om, s_on, st);
        default:
            if (g.M <= 8) return launch_gemv_warp_rows<LEAVES, 2, 1, 2, OUT_F32>(g, out, s_om, s_on, st);
            return launch_gemv_warp_rows<LEAVES, 4, 2, 2, OUT_F32>(g, out, s_om, s_on, st);
    }
}

// Whether the decode form can run this product (host side; depends on M, layout and bounds only).
bool gemv_ok(const TreeArgs& g, int leaves) {
    if (g.M > GV_M || g.s_ak != 1 || g.s_bk != 1 || (g.s_am & 7) || (g.s_bn & 7)) return false;
    if ((reinterpret_cast<uintptr_t>(g.a) & 15u) || (reinterpret_cast<uintptr_t>(g.b) & 15u)) return false;
    for (int i = 0; i <= leaves; ++i)
        if (g.bounds[i] & 7) return false;
    return cdiv(g.N, GV_N) <= 2147483647LL;
}

constexpr int MERGE_THREADS = 256;

// c = l0 + l1 (DEPTH 1) or (l0 + l1) + (l2 + l3) (DEPTH 2), each addition bf16(fp32 + fp32).
template <int DEPTH>
__global__ void __launch_bounds__(MERGE_THREADS) leaf_merge_kernel(const bf16* __restrict__ w, bf16* c, int64_t M,
                                                                    int64_t N, int64_t s_cm, int64_t s_cn) {
    const int64_t mn = M * N;
    const int64_t i = static_cast<int64_t>(blockIdx.x) * MERGE_THREADS + threadIdx.x;
    if (i >= mn) return;
    bf16 s = to_bf16(f32(w[i]) + f32(w[mn + i]));
    if (DEPTH == 2) {
        const bf16 s23 = to_bf16(f32(w[2 * mn + i]) + f32(w[3 * mn + i]));
        s = to_bf16(f32(s) + f32(s23));
    }
    c[(i / N) * s_cm + (i % N) * s_cn] = s;
}

int launch_tree_leaves(const TreeArgs& g, int depth, bf16* w, bool warp_gemv, cudaStream_t st) {
    if (g.M == 0 || g.N == 0) return 0;
    const int64_t gm = cdiv(g.M, TB_M);
    const int64_t gn = cdiv(g.N, TB_N);
    if (depth < 1 || depth > 2 || gm > 65535 || gn > 65535) return static_cast<int>(cudaErrorInvalidValue);
    const int leaves = 1 << depth;
    if (g.bounds[0] != 0 || g.bounds[leaves] != g.K) return static_cast<int>(cudaErrorInvalidValue);
    for (int i = 0; i < leaves; ++i)
        if (g.bounds[i + 1] < g.bounds[i]) return static_cast<int>(cudaErrorInvalidValue);
    if (warp_gemv && g.M <= GW_M && g.M < g_gemv_tile_min_m && gemv_ok(g, leaves)) {  // streams the weight, merges in the block: one launch
        return depth == 1 ? launch_gemv_warp<2, false>(g, g.c, g.s_cm, g.s_cn, st)
                          : launch_gemv_warp<4, false>(g, g.c, g.s_cm, g.s_cn, st);
    }
    if (gemv_ok(g, leaves)) {
        bool merged = false;
        if (int e = launch_gemv<false>(g, leaves, w, g.N, 1, st, &merged)) return e;
        if (merged) return 0;
    } else if (g_tree_form >= 1 && tree_pipe_ok(g, leaves)) {
        if (int e = launch_pipe_leaves(g, leaves, w, st)) return e;
    } else {
        dim3 grid(static_cast<unsigned>(gm), static_cast<unsigned>(gn), static_cast<unsigned>(leaves));
        tree_leaf_kernel<<<grid, TB_THREADS, 0, st>>>(g, w);
    }
    const int64_t blocks = cdiv(g.M * g.N, MERGE_THREADS);
    if (blocks >= 2147483647LL) return static_cast<int>(cudaErrorInvalidValue);
    bf16* c = static_cast<bf16*>(g.c);
    if (depth == 1) {
        leaf_merge_kernel<1><<<static_cast<unsigned>(blocks), MERGE_THREADS, 0, st>>>(w, c, g.M, g.N, g.s_cm, g.s_cn);
    } else {
        leaf_merge_kernel<2><<<static_cast<unsigned>(blocks), MERGE_THREADS, 0, st>>>(w, c, g.M, g.N, g.s_cm, g.s_cn);
    }
    return launch_status();
}

int launch_tree(const TreeArgs& g, int depth, bool out_f32, bool warp_gemv, cudaStream_t st) {
    if (g.M == 0 || g.N == 0) return 0;
    const int64_t gm = cdiv(g.M, TB_M);
    const int64_t gn = cdiv(g.N, TB_N);
    if (gm >= 2147483647LL || gn > 65535) return static_cast<int>(cudaErrorInvalidValue);
    const int leaves = 1 << depth;
    if (g.bounds[0] != 0 || g.bounds[leaves] != g.K) return static_cast<int>(cudaErrorInvalidValue);
    for (int i = 0; i < leaves; ++i)
        if (g.bounds[i + 1] < g.bounds[i]) return static_cast<int>(cudaErrorInvalidValue);
    dim3 grid(static_cast<unsigned>(gm), static_cast<unsigned>(gn));
    if (out_f32) {
        if (depth != 0) return static_cast<int>(cudaErrorInvalidValue);
        if (warp_gemv && g.M <= GW_M && g.M < g_gemv_tile_min_m && gemv_ok(g, 1))
            return launch_gemv_warp<1, true>(g, g.c, g.s_cm, g.s_cn, st);
        if (gemv_ok(g, 1)) return launch_gemv<true>(g, 1, g.c, g.s_cm, g.s_cn, st);  // decode-sized logits
        if (g_tree_form >= 1 && tree_pipe_ok(g, 1)) return launch_pipe_f32(g, st);
        tree_gemm_kernel<0, true><<<grid, TB_THREADS, 0, st>>>(g);
    } else if (g_tree_form >= 1 && depth >= 0 && depth <= 2 && tree_pipe_ok(g, leaves)) {
        return launch_pipe_fused(g, depth, st);
    } else if (depth == 0) {
        tree_gemm_kernel<0, false><<<grid, TB_THREADS, 0, st>>>(g);
    } else if (depth == 1) {
        tree_gemm_kernel<1, false><<<grid, TB_THREADS, 0, st>>>(g);
    } else if (depth == 2) {
        tree_gemm_kernel<2, false><<<grid, TB_THREADS, 0, st>>>(g);
    } else {
        return static_cast<int>(cudaErrorInvalidValue);
    }
    return launch_status();
}

// ---------------------------------------------------------------------------------------------
// CUDA-core FP32 GEMM
// ---------------------------------------------------------------------------------------------
constexpr int SG_M = 64;
constexpr int SG_N = 64;
constexpr int SG_K = 16;
constexpr int SG_THREADS = 256;  // 16 x 16 threads, 4 x 4 outputs each (rows ty + 16 i, cols tx + 16 j)

struct SimtArgs {
    const void* a;
    const void* b;
    void* c;
    int64_t M, N, K;
    int64_t s_am, s_ak, s_bk, s_bn, s_cm, s_cn;
};

template <typename T>
__device__ __forceinline__ float load_f32(const void* p, int64_t off) {
    return f32(static_cast<const T*>(p)[off]);
}

template <typename TA, typename TB, typename TC, bool ACCUM>
__global__ void __launch_bounds__(SG_THREADS) simt_gemm_kernel(SimtArgs g) {
    __shared__ float as[SG_K][SG_M + 4];
    __shared__ float bs[SG_K][SG_N + 4];
    const int tid = threadIdx.x;
    const int tx = tid % 16;
    const int ty = tid / 16;
    const int64_t m0 = static_cast<int64_t>(blockIdx.x) * SG_M;
    const int64_t n0 = static_cast<int64_t>(blockIdx.y) * SG_N;
    const bool a_k_contig = (g.s_ak == 1);
    const bool b_n_contig = (g.s_bn == 1);
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int64_t k0 = 0; k0 < g.K; k0 += SG_K) {
        __syncthreads();
        for (int e = tid; e < SG_M * SG_K; e += SG_THREADS) {
            const int m = a_k_contig ? e / SG_K : e % SG_M;
            const int k = a_k_contig ? e % SG_K : e / SG_M;
            const int64_t gm = m0 + m;
            const int64_t gk = k0 + k;
            as[k][m] = (gm < g.M && gk < g.K) ? load_f32<TA>(g.a, gm * g.s_am + gk * g.s_ak) : 0.0f;
        }
        for (int e = tid; e < SG_N * SG_K; e += SG_THREADS) {
            const int n = b_n_contig ? e % SG_N : e / SG_K;
            const int k = b_n_contig ? e / SG_N : e % SG_K;
            const int64_t gn = n0 + n;
            const int64_t gk = k0 + k;
            bs[k][n] = (gn < g.N && gk < g.K) ? load_f32<TB>(g.b, gk * g.s_bk + gn * g.s_bn) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SG_K; ++k) {
            float av[4], bv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) av[i] = as[k][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) bv[j] = bs[k][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = __fmaf_rn(av[i], bv[j], acc[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int64_t gm = m0 + ty + 16 * i;
        if (gm >= g.M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t gn = n0 + tx + 16 * j;
            if (gn >= g.N) continue;
            TC* p = static_cast<TC*>(g.c) + gm * g.s_cm + gn * g.s_cn;
            if (ACCUM) {
                store_as(p, f32(*p) + acc[i][j]);
            } else {
                store_as(p, acc[i][j]);
            }
        }
    }
}

}  // namespace

// det_gemm: C [M, N] bf16 = tree(A [M, K] @ B [K, N]); bounds b0..b4 of the 2^depth leaves
// (unused entries ignored). depth in {0, 1, 2}.
RL_EXPORT int rl_det_gemm(const void* a, const void* b, void* c, int64_t M, int64_t N, int64_t K, int64_t s_am, int64_t s_ak, int64_t s_bk, int64_t s_bn, int64_t s_cm, int64_t s_cn, int64_t depth, int64_t b0, int64_t b1, int64_t b2, int64_t b3, int64_t b4, void* stream) {
    TreeArgs g{static_cast<const bf16*>(a), static_cast<const bf16*>(b), c, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               {b0, b1, b2, b3, b4}};
    if (depth < 0 || depth > 2) return static_cast<int>(cudaErrorInvalidValue);
    return launch_tree(g, static_cast<int>(depth), false, false, static_cast<cudaStream_t>(stream));
}

// det_gemm, leaf-parallel form (same bits as rl_det_gemm): w is a [2^depth, M, N] bf16 workspace.
// depth in {1, 2}. warp_gemv = 1: for M <= 16 the warp-streamed GEMV (gemv_warp_kernel: one launch,
// w unused) instead of the ring GEMV and the merge launch; the same bits.
RL_EXPORT int rl_det_gemm_leaves(const void* a, const void* b, void* c, void* w, int64_t M, int64_t N, int64_t K, int64_t s_am, int64_t s_ak, int64_t s_bk, int64_t s_bn, int64_t s_cm, int64_t s_cn, int64_t depth, int64_t b0, int64_t b1, int64_t b2, int64_t b3, int64_t b4, int64_t warp_gemv, void* stream) {
    TreeArgs g{static_cast<const bf16*>(a), static_cast<const bf16*>(b), c, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               {b0, b1, b2, b3, b4}};
    return launch_tree_leaves(g, static_cast<int>(depth), static_cast<bf16*>(w), warp_gemv != 0,
                              static_cast<cudaStream_t>(stream));
}

// FP32-output GEMM: C [M, N] fp32 = A [M, K] @ B [K, N] (bf16 operands), one FP32 accumulator
// over all of K in increasing order (lm_head logits, linear_logp logit chunks). warp_gemv as for
// rl_det_gemm_leaves.
RL_EXPORT int rl_gemm_bf16_f32out(const void* a, const void* b, void* c, int64_t M, int64_t N, int64_t K, int64_t s_am, int64_t s_ak, int64_t s_bk, int64_t s_bn, int64_t s_cm, int64_t s_cn, int64_t warp_gemv, void* stream) {
    TreeArgs g{static_cast<const bf16*>(a), static_cast<const bf16*>(b), c, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               {0, K, 0, 0, 0}};
    return launch_tree(g, 0, true, warp_gemv != 0, static_cast<cudaStream_t>(stream));
}

// Pick the decode GEMV's ring variant (0 .. GV_VARIANTS - 1) for every later launch of this process;
// returns the previous one, or -1 (and changes nothing) for a number outside the range. For the sweep
// tool: the bits do not depend on the variant.
RL_EXPORT int64_t rl_gemv_variant(int64_t v) {
    if (v < 0 || v >= GV_VARIANTS) return -1;
    const int64_t old = g_gemv_variant;
    g_gemv_variant = static_cast<int>(v);
    return old;
}

// Make form GV_TILE_DEFAULT (the warpgroup form; the tile form in the host emulation) the decode GEMV
// of det_gemm's leaves and the FP32 logits from m rows up (1 .. GV_M + 1; the default is
// GV_TILE_MIN_M) for every later launch of this process, in place of the warp GEMV below it; returns the previous value, or -1 (and changes nothing) outside the
// range. For the decode-profile tool: the bits do not depend on it.
RL_EXPORT int64_t rl_gemv_tile_min_m(int64_t m) {
    if (m < 1 || m > GV_M + 1) return -1;
    const int64_t old = g_gemv_tile_min_m;
    g_gemv_tile_min_m = m;
    return old;
}

// The same for the warp GEMV's geometry (0 .. GW_VARIANTS - 1).
RL_EXPORT int64_t rl_gemv_warp_variant(int64_t v) {
    if (v < 0 || v >= GW_VARIANTS) return -1;
    const int64_t old = g_gemv_warp_variant;
    g_gemv_warp_variant = static_cast<int>(v);
    return old;
}

// CUDA-core FP32 GEMM. a_f32 / b_f32 / c_f32: 1 when that operand is FP32, 0 when BF16.
// Supported: A fp32 with B bf16 (C bf16, C fp32, or C fp32 with accumulate=1), and A bf16 with B fp32
// into C bf16 / fp32.
RL_EXPORT int rl_gemm_f32_simt(const void* a, const void* b, void* c, int64_t M, int64_t N, int64_t K, int64_t s_am, int64_t s_ak, int64_t s_bk, int64_t s_bn, int64_t s_cm, int64_t s_cn, int64_t a_f32, int64_t b_f32, int64_t c_f32, int64_t accumulate, void* stream) {
    if (M == 0 || N == 0) return 0;
    const int64_t gm = cdiv(M, SG_M);
    const int64_t gn = cdiv(N, SG_N);
    if (gm >= 2147483647LL || gn > 65535) return static_cast<int>(cudaErrorInvalidValue);
    SimtArgs g{a, b, c, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn};
    dim3 grid(static_cast<unsigned>(gm), static_cast<unsigned>(gn));
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (accumulate && !c_f32) return static_cast<int>(cudaErrorInvalidValue);
    if (a_f32 && !b_f32) {
        if (!c_f32) simt_gemm_kernel<float, bf16, bf16, false><<<grid, SG_THREADS, 0, st>>>(g);
        else if (!accumulate) simt_gemm_kernel<float, bf16, float, false><<<grid, SG_THREADS, 0, st>>>(g);
        else simt_gemm_kernel<float, bf16, float, true><<<grid, SG_THREADS, 0, st>>>(g);
    } else if (!a_f32 && b_f32 && !accumulate) {
        if (!c_f32) simt_gemm_kernel<bf16, float, bf16, false><<<grid, SG_THREADS, 0, st>>>(g);
        else simt_gemm_kernel<bf16, float, float, false><<<grid, SG_THREADS, 0, st>>>(g);
    } else {
        return static_cast<int>(cudaErrorInvalidValue);
    }
    return launch_status();
}
