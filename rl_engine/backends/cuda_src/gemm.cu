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
//    Pipelined forms (tree_pipe_kernel, forms 1 and 2 of rl_tree_gemm_form; the WMMA kernels are form 0, the
//    default until they have run on the H200): the same tree with the operands streamed through a
//    cp.async ring and multiplied with ldmatrix + mma.sync, for the fused tree, the leaf-parallel
//    leaves and the FP32-output GEMM; the same bits. Form 3 (tree_wgmma_kernel): the fused tree and
//    the FP32 output of K-contiguous operands with the warpgroup MMA (m64n128k16).
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

using namespace rl;
using namespace nvcuda;

namespace {

// ---------------------------------------------------------------------------------------------
// Tensor-core tree GEMM
// ---------------------------------------------------------------------------------------------
constexpr int TB_M = 128;
constexpr int TB_N = 128;
constexpr int TB_K = 32;
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

struct TreeArgs {
    const bf16* a;
    const bf16* b;
    void* c;
    int64_t M, N, K;
    int64_t s_am, s_ak, s_bk, s_bn, s_cm, s_cn;
    int64_t bounds[5];  // leaf bounds: 2^DEPTH + 1 entries used
};

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
// Matrix descriptor (PTX ISA, "Matrix Descriptor Format") of a K-major operand in the 128-byte
// swizzle layout: start address in 16-byte units (14 bits), leading byte offset 16 (unused by this
// layout), stride byte offset 1024 (between 8-row groups), base offset 0, layout type 1 (128-byte
// swizzle, bits 62-63). Adding (bytes >> 4) moves the start address as long as it stays inside
// shared memory (< 256 KB); the operand must start on a 1024-byte boundary.
__device__ __forceinline__ uint64_t wg_desc_sw128(uint32_t addr) {
    return static_cast<uint64_t>((addr >> 4) & 0x3FFFu) | (static_cast<uint64_t>(1) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
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

// d[32] += A (64 x 16, descriptor da) @ B (16 x 64, K-major descriptor db), FP32 accumulation.
// Accumulator fragment (PTX ISA, m64nNk16): warp w holds rows 16 w .. 16 w + 15; for 8-column
// group j, lane 4 g + t holds (16 w + g, 8 j + 2 t + {0, 1}) in d[4 j], d[4 j + 1] and row + 8 in
// d[4 j + 2], d[4 j + 3].
__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"  // scale-d: accumulate into d
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(1));
}

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
        wg_fence();
        wgmma_n64(acc, da, db);          // step 2 i: k 0..15
        wgmma_n64(acc, da + 2, db + 2);  //           k 16..31 (32 bytes on)
        if (2 * i + 1 < steps) {         // uniform: no step past the leaf's last
            wgmma_n64(acc, da + 4, db + 4);
            wgmma_n64(acc, da + 6, db + 6);
        }
        wg_commit();
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

// ---------------------------------------------------------------------------------------------
// Pipelined tensor-core tree GEMM (tree_pipe_kernel, forms 1 and 2 of rl_tree_gemm_form)
// ---------------------------------------------------------------------------------------------
// tree_gemm_kernel's tree with the operands streamed through a ring of shared-memory slots by
// cp.async and multiplied with ldmatrix + mma.sync m16n8k16 (the HMMA instruction WMMA's 16x16x16
// BF16 tiles are made of; the tile GEMV uses it too). Per output element the steps, their order and
// the roundings are tree_gemm_kernel's: each leaf [lo, hi) accumulated in FP32 over 32-wide K steps
// from lo in increasing k (a step is two MMAs, k 0..15 then 16..31, zero-filled past hi), rounded
// once to BF16, merged bf16(fp32(l) + fp32(r)) as ((l0 + l1) + (l2 + l3)). The leaves follow one
// another through the same ring, so the copies of a leaf's first steps are in flight while the leaf
// before it finishes.
// Geometry (TpGeo): a BM x BN output tile per block of 8 warps (2 along M x 4 along N), each warp a
// (BM / 2) x (BN / 4) sub-tile of 16 x 8 accumulator fragments; STAGES ring slots; the rounded leaf
// sums a leaf must keep for a later merge held in registers (HELD_SMEM false) or in shared memory
// (true: each thread stores and reloads only its own values, so no barrier is needed).
//   form 1: 128 x 128, 4 slots, held in registers (64 x 32 per warp);
//   form 2: 128 x 256, 3 slots, held in shared memory (64 x 64 per warp: half the ldmatrix traffic
//           per MMA; 220 KB of shared memory), the fused bf16 tree only (the leaf-parallel leaves and
//           the FP32-output GEMM run form 1).
// Each operand is either K-contiguous (its slot holds R rows of 32 k, read by ldmatrix) or M- / N-
// contiguous (its slot holds 32 rows of R elements, read by ldmatrix.trans): A_MN / B_MN; both
// layouts hand the MMA the same fragments. Needs (tree_pipe_ok, host side): 16-byte aligned bases,
// the non-unit stride a multiple of 8 elements and, for a K-contiguous operand, leaf starts that are
// multiples of 8, so every 16-byte copy starts inside its row at an aligned address; a copy that
// crosses hi, M or N reads only the bytes before it and zero-fills the rest (cp.async's source size).
// Tiles run TP_GROUP_M tile rows at a time down the tile columns, so neighbouring blocks share B.
constexpr int TP_K = TB_K;
constexpr int TP_THREADS = 256;
constexpr int TP_GROUP_M = 8;
constexpr int TP_LDK = TP_K + 8;  // K-contiguous slot rows: 40 elements (80 bytes: the 8 rows of an
                                  // ldmatrix matrix fall on distinct banks)

template <int BM_, int BN_, int STAGES_, bool HELD_SMEM_>
struct TpGeo {
    static constexpr int BM = BM_, BN = BN_, STAGES = STAGES_;
    static constexpr bool HELD_SMEM = HELD_SMEM_;
    static constexpr int MI = BM / 2 / 16;  // fragments per warp along M (16 rows each)
    static constexpr int NI = BN / 4 / 8;   // fragments per warp along N (8 columns each)
    static_assert(BM % 32 == 0 && BN % 32 == 0, "whole fragments per warp; B fragments loaded in pairs of k halves");
};
typedef TpGeo<128, 128, 4, false> TpForm1;
typedef TpGeo<128, 256, 3, true> TpForm2;

// One operand's slot: R rows (M or N) x 32 k.
template <bool MN, int R>
struct TpOperand {
    static constexpr int LD = MN ? R + 8 : TP_LDK;  // slot row stride (elements); R + 8: rows 16 bytes
                                                    // apart in banks, as for the K-contiguous rows
    static constexpr int ELEMS = MN ? TP_K * LD : R * LD;  // elements per slot
    static constexpr int CHUNKS = R * TP_K / 8;            // 16-byte copies per slot
    static constexpr int NCOPY = CHUNKS / TP_THREADS;      // per thread
    static_assert(CHUNKS % TP_THREADS == 0, "every thread copies the same number of chunks");
};

template <class G, bool A_MN, bool B_MN>
struct TpSmem {
    typedef TpOperand<A_MN, G::BM> OA;
    typedef TpOperand<B_MN, G::BN> OB;
    static constexpr int SLOT = OA::ELEMS + OB::ELEMS;
    static constexpr size_t RING = static_cast<size_t>(G::STAGES) * SLOT * sizeof(bf16);
    static constexpr size_t HELD = G::HELD_SMEM ? static_cast<size_t>(2) * G::BM * G::BN * sizeof(bf16) : 0;
    static constexpr size_t BYTES = RING + HELD;
    static_assert(RING % 16 == 0, "the held sums start 16-byte aligned");
};

// One thread's copies of one operand: chunk i is copy tid + TP_THREADS i of the slot.
template <bool MN, int R>
struct TpCopies {
    typedef TpOperand<MN, R> O;
    const bf16* src[O::NCOPY];  // the chunk's address at k = 0 (nullptr: row past the edge)
    int dst[O::NCOPY];          // its place in the slot (elements)
    int koff[O::NCOPY];         // K-contiguous: its first k in the step; MN: its k row
    int bytes[O::NCOPY];        // MN: bytes before the M / N edge (16 inside)

    // Operand rows r0 .. r0 + R - 1 (M or N) below r_lim, addressed as x[r * s_r + k * s_k].
    __device__ __forceinline__ void init(const bf16* x, int64_t s_r, int64_t s_k, int64_t r0, int64_t r_lim) {
#pragma unroll
        for (int i = 0; i < O::NCOPY; ++i) {
            const int c = static_cast<int>(threadIdx.x) + TP_THREADS * i;
            if (MN) {
                const int kr = c / (R / 8);
                const int rc = (c % (R / 8)) * 8;
                const int64_t left = r_lim - (r0 + rc);
                src[i] = left > 0 ? x + (r0 + rc) + kr * s_k : nullptr;
                bytes[i] = left >= 8 ? 16 : (left > 0 ? static_cast<int>(2 * left) : 0);
                dst[i] = kr * O::LD + rc;
                koff[i] = kr;
            } else {
                const int r = c / (TP_K / 8);
                const int kc = (c % (TP_K / 8)) * 8;
                src[i] = r0 + r < r_lim ? x + (r0 + r) * s_r + kc : nullptr;
                bytes[i] = 16;
                dst[i] = r * O::LD + kc;
                koff[i] = kc;
            }
        }
    }

    // The copies of the 32-wide step at k0 of a leaf ending at hi into slot (elements at slot), from
    // the operand part `part` elements on (the lo part of a hi / lo pair; else 0).
    __device__ __forceinline__ void issue(bf16* slot, int64_t k0, int64_t hi, int64_t s_k, const bf16* dummy,
                                          int64_t part = 0) const {
#pragma unroll
        for (int i = 0; i < O::NCOPY; ++i) {
            const int64_t k = k0 + koff[i];
            int n = 0;
            const bf16* p = dummy;
            if (src[i] != nullptr && k < hi) {
                if (MN) {
                    n = bytes[i];
                    p = src[i] + k0 * s_k + part;
                } else {
                    n = hi - k >= 8 ? 16 : static_cast<int>(2 * (hi - k));
                    p = src[i] + k0 + part;
                }
            }
            cp_async16(slot + dst[i], p, n);
        }
    }
};

// The bound of leaf edge i (0 .. 4) without indexing a parameter array at run time.
__device__ __forceinline__ int64_t tp_bound(const TreeArgs& g, int i) {
    return i == 0 ? g.bounds[0] : i == 1 ? g.bounds[1] : i == 2 ? g.bounds[2] : i == 3 ? g.bounds[3] : g.bounds[4];
}

// Two BF16 values in one register (low half: the first), and back (exact).
__device__ __forceinline__ uint32_t tp_pack(bf16 lo, bf16 hi) {
    return static_cast<uint32_t>(static_cast<__nv_bfloat16_raw>(lo).x) |
           (static_cast<uint32_t>(static_cast<__nv_bfloat16_raw>(hi).x) << 16);
}
__device__ __forceinline__ bf16 tp_lo(uint32_t v) {
    __nv_bfloat16_raw r;
    r.x = static_cast<unsigned short>(v & 0xffffu);
    return bf16(r);
}
__device__ __forceinline__ bf16 tp_hi(uint32_t v) {
    __nv_bfloat16_raw r;
    r.x = static_cast<unsigned short>(v >> 16);
    return bf16(r);
}
// round_leaf of two neighbouring sums, and merge_into of two packed pairs.
__device__ __forceinline__ uint32_t tp_round2(float lo, float hi) { return tp_pack(to_bf16(lo), to_bf16(hi)); }
__device__ __forceinline__ uint32_t tp_merge2(uint32_t l, uint32_t r) {
    return tp_pack(to_bf16(f32(tp_lo(l)) + f32(tp_lo(r))), to_bf16(f32(tp_hi(l)) + f32(tp_hi(r))));
}

// The rounded leaf sums a block keeps for later merges: two sets (h0: l0, then l0 + l1, then the
// result; h1: l2, then l2 + l3) of this thread's MI x NI x 2 packed pairs, in registers or in this
// thread's own places of shared memory (word (set, pair) of lane l at [set][pair][warp][lane]:
// consecutive lanes, consecutive banks).
template <class G>
struct TpHeld {
    static constexpr int PAIRS = G::MI * G::NI * 2;
    uint32_t reg[G::HELD_SMEM ? 1 : 2][G::HELD_SMEM ? 1 : PAIRS];
    uint32_t* mem;

    __device__ __forceinline__ void init(unsigned char* base) {
        mem = reinterpret_cast<uint32_t*>(base) + threadIdx.x;
    }
    __device__ __forceinline__ uint32_t get(int set, int q) const {
        if (G::HELD_SMEM) return mem[(set * PAIRS + q) * TP_THREADS];
        return reg[G::HELD_SMEM ? 0 : set][G::HELD_SMEM ? 0 : q];
    }
    __device__ __forceinline__ void put(int set, int q, uint32_t v) {
        if (G::HELD_SMEM) mem[(set * PAIRS + q) * TP_THREADS] = v;
        else reg[G::HELD_SMEM ? 0 : set][G::HELD_SMEM ? 0 : q] = v;
    }
};

// DEPTH: the tree (2^DEPTH leaves, merged in the block); LEAVES: one leaf per blockIdx.z instead,
// rounded to BF16 and stored at out + leaf M N (the leaf-parallel form's workspace; DEPTH 0);
// OUT_F32: the FP32 sums themselves (DEPTH 0). pairs: the host found two neighbouring columns one
// 4-byte (BF16) or 8-byte (FP32) aligned store apart.
// HILO (DEPTH 0, rl_gemm_hilo): A is a pair of BF16 parts of one FP32 operand, g.a (hi) and a_lo (lo,
// same strides), and one FP32 accumulator runs over K in blocks of HILO_BLOCK: the block's hi part
// (two 32-wide steps), then its lo part against the same B rows, zero-filled past K; it starts from
// acc_in [M, N] (row stride s_acc) when given, else from 0, and is stored as FP32 or rounded once.
constexpr int HILO_BLOCK = 64;
template <class G, int DEPTH, bool OUT_F32, bool LEAVES, bool A_MN, bool B_MN, bool HILO = false>
__global__ void __launch_bounds__(TP_THREADS, 1)
    tree_pipe_kernel(TreeArgs g, void* out, int64_t s_om, int64_t s_on, int pairs, const bf16* a_lo,
                     const float* acc_in, int64_t s_acc) {
    static_assert(!(OUT_F32 || LEAVES || HILO) || DEPTH == 0, "FP32 output, the leaf workspace and hi / lo are single leaves");
    static_assert(!(HILO && LEAVES), "hi / lo products have no leaf workspace");
    static_assert(HILO_BLOCK == 2 * TP_K, "a hi / lo block is two steps of each part");
    typedef TpSmem<G, A_MN, B_MN> S;
    constexpr int NL = 1 << DEPTH;
    constexpr int MI = G::MI, NI = G::NI;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* ring = reinterpret_cast<bf16*>(smem_raw);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int wm = warp / 4;
    const int wn = warp % 4;

    // Grouped tile order.
    const int64_t tiles_m = cdiv(g.M, G::BM);
    const int64_t tiles_n = cdiv(g.N, G::BN);
    const int64_t pid = blockIdx.x;
    const int64_t group = static_cast<int64_t>(TP_GROUP_M) * tiles_n;
    const int64_t first_m = (pid / group) * TP_GROUP_M;
    const int64_t rows_here = tiles_m - first_m < TP_GROUP_M ? tiles_m - first_m : TP_GROUP_M;
    const int64_t m0 = (first_m + (pid % group) % rows_here) * G::BM;
    const int64_t n0 = ((pid % group) / rows_here) * G::BN;
    const int first = LEAVES ? static_cast<int>(blockIdx.z) : 0;

    TpCopies<A_MN, G::BM> ca;
    TpCopies<B_MN, G::BN> cb;
    ca.init(g.a, g.s_am, g.s_ak, m0, g.M);
    cb.init(g.b, g.s_bn, g.s_bk, n0, g.N);

    // The copy cursor: leaf lf, step at k0 (lf == first + NL: every step issued). hi / lo: step `issued`
    // of hilo_steps is part (issued >> 1) & 1 of block issued >> 2, its half issued & 1.
    int lf = first;
    int64_t k0 = tp_bound(g, first);
    auto skip_empty = [&]() {
        while (lf < first + NL && k0 >= tp_bound(g, lf + 1)) {
            ++lf;
            if (lf < first + NL) k0 = tp_bound(g, lf);
        }
    };
    if (!HILO) skip_empty();
    const int64_t hilo_steps = HILO ? 4 * cdiv(g.K, static_cast<int64_t>(HILO_BLOCK)) : 0;
    const int64_t lo_part = HILO ? a_lo - g.a : 0;
    int64_t issued = 0;
    auto issue_next = [&]() {
        if (HILO) {
            if (issued < hilo_steps) {
                bf16* slot = ring + (issued % G::STAGES) * S::SLOT;
                const int64_t kk = (issued >> 2) * HILO_BLOCK + (issued & 1) * TP_K;
                ca.issue(slot, kk, g.K, g.s_ak, g.a, ((issued >> 1) & 1) ? lo_part : 0);
                cb.issue(slot + S::OA::ELEMS, kk, g.K, g.s_bk, g.a);
            }
        } else if (lf < first + NL) {
            bf16* slot = ring + (issued % G::STAGES) * S::SLOT;
            const int64_t hi = tp_bound(g, lf + 1);
            ca.issue(slot, k0, hi, g.s_ak, g.a);
            cb.issue(slot + S::OA::ELEMS, k0, hi, g.s_bk, g.a);
            k0 += TP_K;
            skip_empty();
        }
        cp_async_commit();
        ++issued;
    };
#pragma unroll
    for (int s = 0; s < G::STAGES - 1; ++s) issue_next();

    // ldmatrix row addresses (elements from the operand's slot base, without the step's k or slot).
    // A, K-contiguous: lanes 0..15 rows 0..15 at k 0, lanes 16..31 the same rows at k 8 (+16 for the
    // second MMA). A, M-contiguous: lane 8q + r, k row 8 (q >> 1) + r, columns 8 (q & 1) on (+16 rows).
    // B, K-contiguous: lane 8q + r, column row r of the fragment at k 8q (one x4: both MMAs' halves).
    // B, N-contiguous: lane l, k row l, the fragment's 8 columns.
    constexpr int LDA = S::OA::LD, LDB = S::OB::LD;
    const int a_off = A_MN ? ((lane >> 4) * 8 + (lane & 7)) * LDA + wm * (16 * MI) + ((lane >> 3) & 1) * 8
                           : (wm * (16 * MI) + (lane & 15)) * LDA + (lane >> 4) * 8;
    const int b_off = B_MN ? lane * LDB + wn * (8 * NI) : (wn * (8 * NI) + (lane & 7)) * LDB + (lane >> 3) * 8;
    constexpr int A_FRAG = A_MN ? 16 : 16 * LDA;  // to the next 16 rows
    constexpr int A_HALF = A_MN ? 16 * LDA : 16;  // to k 16
    constexpr int B_FRAG = B_MN ? 8 : 8 * LDB;    // to the next 8 columns

    float acc[MI][NI][4];
    TpHeld<G> held;
    held.init(smem_raw + S::RING);
    int64_t step = 0;
#pragma unroll
    for (int l = 0; l < NL; ++l) {
        const int leaf = first + l;
        const int64_t steps =
            HILO ? hilo_steps : cdiv(tp_bound(g, leaf + 1) - tp_bound(g, leaf), static_cast<int64_t>(TP_K));
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float v = 0.0f;
                    if (HILO && acc_in != nullptr) {
                        const int64_t r = m0 + wm * (16 * MI) + 16 * i + (lane >> 2) + 8 * (e >> 1);
                        const int64_t c = n0 + wn * (8 * NI) + 8 * j + 2 * (lane & 3) + (e & 1);
                        if (r < g.M && c < g.N) v = acc_in[r * s_acc + c];
                    }
                    acc[i][j][e] = v;
                }
        for (int64_t s = 0; s < steps; ++s, ++step) {
            cp_async_wait<G::STAGES - 2>();
            __syncthreads();  // this step's slot has landed for every thread; the last one's is free
            issue_next();
            const bf16* sa = ring + (step % G::STAGES) * S::SLOT;
            const bf16* sb = sa + S::OA::ELEMS;
            uint32_t bq[NI][4];
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                if (B_MN) ldsm_x4_t(bq[j], sb + b_off + j * B_FRAG);
                else ldsm_x4(bq[j], sb + b_off + j * B_FRAG);
            }
#pragma unroll
            for (int c = 0; c < 2; ++c) {  // k 0..15, then 16..31
                uint32_t a[MI][4];
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    if (A_MN) ldsm_x4_t(a[i], sa + a_off + i * A_FRAG + c * A_HALF);
                    else ldsm_x4(a[i], sa + a_off + i * A_FRAG + c * A_HALF);
                }
#pragma unroll
                for (int j = 0; j < NI; ++j) {
                    const uint32_t b[2] = {bq[j][2 * c], bq[j][2 * c + 1]};
#pragma unroll
                    for (int i = 0; i < MI; ++i) mma_bf16_16816(acc[i][j], a[i], b);
                }
            }
        }
        if (!OUT_F32) {
            // l0 into h0; l0 + l1 into h0; l2 into h1; l2 + l3 into h1, then (l0 + l1) + (l2 + l3) into h0.
            const int set = l < 2 ? 0 : 1;
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j)
#pragma unroll
                    for (int p = 0; p < 2; ++p) {
                        const int q = (i * NI + j) * 2 + p;
                        uint32_t v = tp_round2(acc[i][j][2 * p], acc[i][j][2 * p + 1]);
                        if (l & 1) v = tp_merge2(held.get(set, q), v);
                        if (l == 3) v = tp_merge2(held.get(0, q), v);
                        held.put(l == 3 ? 0 : set, q, v);
                    }
        }
    }
    cp_async_wait<0>();

    const int gq = lane >> 2;
    const int t = lane & 3;
    const int64_t leaf_off = LEAVES ? static_cast<int64_t>(first) * g.M * g.N : 0;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                const int64_t r = m0 + wm * (16 * MI) + 16 * i + gq + 8 * p;
                const int64_t c = n0 + wn * (8 * NI) + 8 * j + 2 * t;
                if (r >= g.M || c >= g.N) continue;
                const int64_t off = leaf_off + r * s_om + c * s_on;
                const bool two = c + 1 < g.N;
                if (OUT_F32) {
                    float* o = static_cast<float*>(out) + off;
                    if (two && pairs) {
                        *reinterpret_cast<float2*>(o) = make_float2(acc[i][j][2 * p], acc[i][j][2 * p + 1]);
                    } else {
                        o[0] = acc[i][j][2 * p];
                        if (two) o[s_on] = acc[i][j][2 * p + 1];
                    }
                } else {
                    const uint32_t v = held.get(0, (i * NI + j) * 2 + p);
                    bf16* o = static_cast<bf16*>(out) + off;
                    if (two && pairs) {
                        *reinterpret_cast<uint32_t*>(o) = v;
                    } else {
                        o[0] = tp_lo(v);
                        if (two) o[s_on] = tp_hi(v);
                    }
                }
            }
}

// Whether tree_pipe_kernel can run this product with leaves [0, leaves) (host side; layout, alignment
// and bounds only, never M).
bool tree_pipe_ok(const TreeArgs& g, int leaves) {
    if ((reinterpret_cast<uintptr_t>(g.a) & 15u) || (reinterpret_cast<uintptr_t>(g.b) & 15u)) return false;
    const bool a_k = g.s_ak == 1;
    const bool b_k = g.s_bk == 1;
    if (a_k ? (g.s_am & 7) != 0 : (g.s_am != 1 || (g.s_ak & 7) != 0)) return false;
    if (b_k ? (g.s_bn & 7) != 0 : (g.s_bn != 1 || (g.s_bk & 7) != 0)) return false;
    if (a_k || b_k)
        for (int i = 0; i < leaves; ++i)
            if (g.bounds[i] & 7) return false;
    return cdiv(g.M, 128) * cdiv(g.N, 128) < 2147483647LL;
}

// The form of the fused and leaf-parallel GEMMs at training sizes (rl_tree_gemm_form): 0 = the WMMA
// kernels (tree_gemm_kernel / tree_leaf_kernel); 1 = tree_pipe_kernel in TpForm1 and 2 = the fused tree
// in TpForm2 (the rest in TpForm1), where tree_pipe_ok holds; 3 = the fused tree and the FP32 output
// by tree_wgmma_kernel where tree_wgmma_ok holds (the GPU only), the rest as form 1.
int g_tree_form = 0;
constexpr int TREE_FORMS = 4;

template <class G, int DEPTH, bool OUT_F32, bool LEAVES, bool A_MN, bool B_MN>
int launch_tree_pipe_as(const TreeArgs& g, int z, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    auto kernel = tree_pipe_kernel<G, DEPTH, OUT_F32, LEAVES, A_MN, B_MN>;
    constexpr size_t smem = TpSmem<G, A_MN, B_MN>::BYTES;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, G::BM) * cdiv(g.N, G::BN);
    const uintptr_t align = OUT_F32 ? 7u : 3u;
    const int pairs = s_on == 1 && (s_om % 2) == 0 && (reinterpret_cast<uintptr_t>(out) & align) == 0;
    dim3 grid(static_cast<unsigned>(tiles), 1, static_cast<unsigned>(z));
    kernel<<<grid, TP_THREADS, smem, st>>>(g, out, s_om, s_on, pairs, nullptr, nullptr, 0);
    return launch_status();
}

template <class G, int DEPTH, bool OUT_F32, bool LEAVES>
int launch_tree_pipe(const TreeArgs& g, int z, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    const bool a_mn = g.s_ak != 1;
    const bool b_mn = g.s_bk != 1;
    if (a_mn) {
        return b_mn ? launch_tree_pipe_as<G, DEPTH, OUT_F32, LEAVES, true, true>(g, z, out, s_om, s_on, st)
                    : launch_tree_pipe_as<G, DEPTH, OUT_F32, LEAVES, true, false>(g, z, out, s_om, s_on, st);
    }
    return b_mn ? launch_tree_pipe_as<G, DEPTH, OUT_F32, LEAVES, false, true>(g, z, out, s_om, s_on, st)
                : launch_tree_pipe_as<G, DEPTH, OUT_F32, LEAVES, false, false>(g, z, out, s_om, s_on, st);
}

template <bool OUT_F32, bool A_MN, bool B_MN>
int launch_hilo_as(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, cudaStream_t st) {
    auto kernel = tree_pipe_kernel<TpForm1, 0, OUT_F32, false, A_MN, B_MN, true>;
    constexpr size_t smem = TpSmem<TpForm1, A_MN, B_MN>::BYTES;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, TpForm1::BM) * cdiv(g.N, TpForm1::BN);
    const uintptr_t align = OUT_F32 ? 7u : 3u;
    const int pairs = g.s_cn == 1 && (g.s_cm % 2) == 0 && (reinterpret_cast<uintptr_t>(g.c) & align) == 0;
    kernel<<<static_cast<unsigned>(tiles), TP_THREADS, smem, st>>>(g, g.c, g.s_cm, g.s_cn, pairs, lo, acc_in, s_acc);
    return launch_status();
}

// Warpgroup form of the fused tree (tree_wgmma_kernel, form 3 of rl_tree_gemm_form; the GPU only):
// tree_pipe_kernel's leaves and merges with the Hopper warpgroup MMA. A block of two warpgroups owns a
// 128 x 128 output tile, warpgroup w rows 64 w .. 64 w + 63, and multiplies with wgmma.mma_async
// m64n128k16 from the 128-byte-swizzle K-major ring slots of gemv_wgmma_kernel (64 k of 128 A rows and
// 128 B rows per slot, 32 KB; TW_STAGES slots). The K loop of each leaf is the fused kernel's: 32-wide
// steps from the leaf's first index in increasing k, each two k16 products, zero-filled past the leaf's
// end (a slot's second step is left out when the leaf ends inside its first), one FP32 accumulator per
// output element that takes one k16 product per instruction in increasing k, as the HMMA of mma.sync
// does (the warpgroup GEMV's bits equal the WMMA kernel's on the H200). At a leaf's end the warpgroup
// waits for its MMAs, rounds the leaf to BF16 and merges it as tree_pipe_kernel does (held sums in
// registers). Needs K-contiguous operands (the forward's x @ w^T, the FP32 logits), 16-byte aligned
// rows and every leaf bound a multiple of 8 (tree_wgmma_ok); other products run form 1.
constexpr int TW_BM = 128;
constexpr int TW_BN = 128;
constexpr int TW_SK = 2 * TB_K;                     // k per ring slot
constexpr int TW_HALF = TW_BM * TW_SK * 2;          // bytes of one operand in a slot
constexpr int TW_SLOT = 2 * TW_HALF;                // A rows, then B rows
constexpr int TW_STAGES = 4;
constexpr int TW_THREADS = 256;

#ifndef RL_HOST_EMU
// d[64] += A (64 x 16, descriptor da) @ B (16 x 128, K-major descriptor db), FP32 accumulation;
// fragment as wgmma_n64's, with 16 column groups of 8.
__device__ __forceinline__ void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1));
}

template <int DEPTH, bool OUT_F32>
__global__ void __launch_bounds__(TW_THREADS, 1) tree_wgmma_kernel(TreeArgs g, int pairs) {
    static_assert(!OUT_F32 || DEPTH == 0, "FP32 output is a single leaf");
    constexpr int NL = 1 << DEPTH;
    extern __shared__ __align__(1024) unsigned char smem_raw[];  // the swizzle needs 1024-byte slots
    const int tid = threadIdx.x;
    const int wg = tid >> 7;            // warpgroup: rows 64 wg .. 64 wg + 63 of the tile
    const int warp = (tid >> 5) & 3;    // warp in the warpgroup: 16 of those rows
    const int lane = tid & 31;

    const int64_t tiles_m = cdiv(g.M, TW_BM);
    const int64_t tiles_n = cdiv(g.N, TW_BN);
    const int64_t pid = blockIdx.x;
    const int64_t group = static_cast<int64_t>(TP_GROUP_M) * tiles_n;
    const int64_t first_m = (pid / group) * TP_GROUP_M;
    const int64_t rows_here = tiles_m - first_m < TP_GROUP_M ? tiles_m - first_m : TP_GROUP_M;
    const int64_t m0 = (first_m + (pid % group) % rows_here) * TW_BM;
    const int64_t n0 = ((pid % group) / rows_here) * TW_BN;

    // This thread's copies: chunk kc = tid % 8 of rows r0 + 32 i (i < 4: A rows, i >= 4: B rows).
    const int kc = tid & 7;
    const int r0 = tid >> 3;
    const uint32_t ring = smem_u32(smem_raw);
    if (ring & 1023u) __trap();  // dynamic shared memory starts 1024-byte aligned
    const uint32_t dst0 = ring + r0 * 128 + ((kc ^ (r0 & 7)) << 4);  // + 4096 i (32 rows), + TW_HALF for B
    const bf16* src[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = r0 + 32 * (i & 3);
        const bf16* p = nullptr;
        if (i < 4) {
            if (m0 + r < g.M) p = g.a + (m0 + r) * g.s_am + 8 * kc;
        } else if (n0 + r < g.N) {
            p = g.b + (n0 + r) * g.s_bn + 8 * kc;
        }
        src[i] = p;
    }

    // The copy cursor: leaf lf, slot at k0 (64 k); lf == NL: every slot issued.
    int lf = 0;
    int64_t k0 = tp_bound(g, 0);
    auto skip_empty = [&]() {
        while (lf < NL && k0 >= tp_bound(g, lf + 1)) {
            ++lf;
            if (lf < NL) k0 = tp_bound(g, lf);
        }
    };
    skip_empty();
    int issued = 0;
    auto issue_next = [&]() {
        if (lf < NL) {
            const uint32_t d = dst0 + (issued % TW_STAGES) * TW_SLOT;
            const bool in = k0 + 8 * kc < tp_bound(g, lf + 1);  // bounds are multiples of 8
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const bool ok = in && src[i] != nullptr;
                cp_async16_s(d + (i >= 4 ? TW_HALF : 0) + 4096 * (i & 3), ok ? src[i] + k0 : g.a, ok ? 16 : 0);
            }
            k0 += TW_SK;
            skip_empty();
        }
        cp_async_commit();
        ++issued;
    };
#pragma unroll
    for (int s = 0; s < TW_STAGES - 1; ++s) issue_next();

    const uint64_t desc0 = wg_desc_sw128(ring + wg * (64 * 128));  // this warpgroup's 64 A rows
    const uint64_t descb0 = wg_desc_sw128(ring + TW_HALF);
    float acc[64];
    uint32_t h0[32], h1[32];
    int consumed = 0;
#pragma unroll
    for (int l = 0; l < NL; ++l) {
        const int64_t width = tp_bound(g, l + 1) - tp_bound(g, l);
        const int64_t steps = cdiv(width, static_cast<int64_t>(TB_K));
        const int64_t slots = cdiv(width, static_cast<int64_t>(TW_SK));
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[e] = 0.0f;
        for (int64_t i = 0; i < slots; ++i, ++consumed) {
            cp_async_wait<TW_STAGES - 2>();
            __syncthreads();      // this slot has landed for every thread
            fence_proxy_async();  // ... and is visible to the warpgroup MMA's reads
            const uint64_t off = static_cast<uint64_t>(((consumed % TW_STAGES) * TW_SLOT) >> 4);
            const uint64_t da = desc0 + off;
            const uint64_t db = descb0 + off;
            wg_fence();
            wgmma_n128(acc, da, db);          // step 2 i: k 0..15
            wgmma_n128(acc, da + 2, db + 2);  //           k 16..31
            if (2 * i + 1 < steps) {          // uniform: no step past the leaf's last
                wgmma_n128(acc, da + 4, db + 4);
                wgmma_n128(acc, da + 6, db + 6);
            }
            wg_commit();
            wg_wait1();       // this warp's MMAs of the slot before have completed
            __syncthreads();  // ... every warp's: its ring place takes the next slot
            issue_next();
        }
        wg_wait0();  // the leaf's sums are in acc
        if (!OUT_F32) {
#pragma unroll
            for (int q = 0; q < 32; ++q) {
                uint32_t v = tp_round2(acc[2 * q], acc[2 * q + 1]);
                if (l == 0) {
                    h0[q] = v;
                } else if (l == 1) {
                    h0[q] = tp_merge2(h0[q], v);
                } else if (l == 2) {
                    h1[q] = v;
                } else {
                    h0[q] = tp_merge2(h0[q], tp_merge2(h1[q], v));
                }
            }
        }
    }
    cp_async_wait<0>();

    const int gq = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int j = 0; j < TW_BN / 8; ++j)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int q = 2 * j + p;  // acc[2 q], acc[2 q + 1] = d[4 j + 2 p], d[4 j + 2 p + 1]
            const int64_t r = m0 + 64 * wg + 16 * warp + gq + 8 * p;
            const int64_t c = n0 + 8 * j + 2 * t;
            if (r >= g.M || c >= g.N) continue;
            const int64_t off = r * g.s_cm + c * g.s_cn;
            const bool two = c + 1 < g.N;
            if (OUT_F32) {
                float* o = static_cast<float*>(g.c) + off;
                if (two && pairs) {
                    *reinterpret_cast<float2*>(o) = make_float2(acc[2 * q], acc[2 * q + 1]);
                } else {
                    o[0] = acc[2 * q];
                    if (two) o[g.s_cn] = acc[2 * q + 1];
                }
            } else {
                bf16* o = static_cast<bf16*>(g.c) + off;
                if (two && pairs) {
                    *reinterpret_cast<uint32_t*>(o) = h0[q];
                } else {
                    o[0] = tp_lo(h0[q]);
                    if (two) o[g.s_cn] = tp_hi(h0[q]);
                }
            }
        }
}
#endif

// Whether tree_wgmma_kernel can run this product with leaves [0, leaves) (host side).
bool tree_wgmma_ok(const TreeArgs& g, int leaves) {
    if (g.s_ak != 1 || g.s_bk != 1 || (g.s_am & 7) || (g.s_bn & 7)) return false;
    if ((reinterpret_cast<uintptr_t>(g.a) & 15u) || (reinterpret_cast<uintptr_t>(g.b) & 15u)) return false;
    for (int i = 0; i <= leaves; ++i)
        if (g.bounds[i] & 7) return false;
    return cdiv(g.M, TW_BM) * cdiv(g.N, TW_BN) < 2147483647LL;
}

template <int DEPTH, bool OUT_F32>
int launch_tree_wgmma(const TreeArgs& g, cudaStream_t st) {
#ifdef RL_HOST_EMU
    (void)g, (void)st;
    return static_cast<int>(cudaErrorNotSupported);  // the host emulation has no warpgroup MMA
#else
    auto kernel = tree_wgmma_kernel<DEPTH, OUT_F32>;
    constexpr int smem = TW_STAGES * TW_SLOT;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, TW_BM) * cdiv(g.N, TW_BN);
    const uintptr_t align = OUT_F32 ? 7u : 3u;
    const int pairs = g.s_cn == 1 && (g.s_cm % 2) == 0 && (reinterpret_cast<uintptr_t>(g.c) & align) == 0;
    kernel<<<static_cast<unsigned>(tiles), TW_THREADS, smem, st>>>(g, pairs);
    return launch_status();
#endif
}

// The fused bf16 tree of depth 0 .. 2 in the process's pipelined form.
template <class G>
int launch_tree_pipe_fused(const TreeArgs& g, int depth, cudaStream_t st) {
    if (depth == 0) return launch_tree_pipe<G, 0, false, false>(g, 1, g.c, g.s_cm, g.s_cn, st);
    if (depth == 1) return launch_tree_pipe<G, 1, false, false>(g, 1, g.c, g.s_cm, g.s_cn, st);
    return launch_tree_pipe<G, 2, false, false>(g, 1, g.c, g.s_cm, g.s_cn, st);
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
        if (int e = launch_tree_pipe<TpForm1, 0, false, true>(g, leaves, w, g.N, 1, st)) return e;
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
        if (g_tree_form == 3 && tree_wgmma_ok(g, 1)) return launch_tree_wgmma<0, true>(g, st);
        if (g_tree_form >= 1 && tree_pipe_ok(g, 1)) return launch_tree_pipe<TpForm1, 0, true, false>(g, 1, g.c, g.s_cm, g.s_cn, st);
        tree_gemm_kernel<0, true><<<grid, TB_THREADS, 0, st>>>(g);
    } else if (g_tree_form == 3 && depth >= 0 && depth <= 2 && tree_wgmma_ok(g, leaves)) {
        if (depth == 0) return launch_tree_wgmma<0, false>(g, st);
        if (depth == 1) return launch_tree_wgmma<1, false>(g, st);
        return launch_tree_wgmma<2, false>(g, st);
    } else if (g_tree_form >= 1 && depth >= 0 && depth <= 2 && tree_pipe_ok(g, leaves)) {
        return g_tree_form == 2 ? launch_tree_pipe_fused<TpForm2>(g, depth, st) : launch_tree_pipe_fused<TpForm1>(g, depth, st);
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

// CUDA-core FP32 GEMM. a_f32 / b_f32 / c_f32: 1 when that operand is FP32, 0 when BF16.
// Supported: A fp32 with B bf16 (C bf16, C fp32, or C fp32 with accumulate=1), and A bf16 with B fp32
// into C bf16 / fp32.
// hi / lo GEMM (the tensor-core form of linear_logp's backward GEMMs, mirroring the Triton backend's
// _bwd_dhidden_kernel / _bwd_dweight_kernel): C [M, N] = acc_in + sum over 64-wide K blocks in increasing
// order of (hi_blk @ B_blk, then lo_blk @ B_blk), hi and lo [M, K] BF16 with the same strides, B [K, N]
// BF16, one FP32 accumulator per output element (tree_pipe_kernel, HILO); acc_in [M, N] FP32 with row
// stride s_acc and unit column stride, or null for 0; C FP32 (out_f32 = 1; may be acc_in itself) or BF16
// rounded once. Needs tree_pipe_ok's layout for (hi, B) with B N-contiguous (the weight chunk of
// dhidden, the hidden states of dweight) and lo with hi's alignment; else cudaErrorInvalidValue
// before any launch.
RL_EXPORT int rl_gemm_hilo(const void* hi, const void* lo, const void* b, void* c, const void* acc_in, int64_t M, int64_t N, int64_t K, int64_t s_am, int64_t s_ak, int64_t s_bk, int64_t s_bn, int64_t s_cm, int64_t s_cn, int64_t s_acc, int64_t out_f32, void* stream) {
    if (M == 0 || N == 0) return 0;
    TreeArgs g{static_cast<const bf16*>(hi), static_cast<const bf16*>(b), c, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               {0, K, K, K, K}};
    if (!tree_pipe_ok(g, 1) || (reinterpret_cast<uintptr_t>(lo) & 15u)) return static_cast<int>(cudaErrorInvalidValue);
    const bf16* l = static_cast<const bf16*>(lo);
    const float* in = static_cast<const float*>(acc_in);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (s_bk == 1) return static_cast<int>(cudaErrorInvalidValue);  // B is N-contiguous in both products
    if (s_ak != 1) {
        return out_f32 ? launch_hilo_as<true, true, true>(g, l, in, s_acc, st)
                       : launch_hilo_as<false, true, true>(g, l, in, s_acc, st);
    }
    return out_f32 ? launch_hilo_as<true, false, true>(g, l, in, s_acc, st)
                   : launch_hilo_as<false, false, true>(g, l, in, s_acc, st);
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

// Pick the form of the GEMMs at training sizes (the fused tree, its leaf-parallel form and the FP32-output
// GEMM, wherever the decode GEMVs do not run) for every later launch of this process: 0 = the WMMA
// kernels, 1 and 2 = the pipelined kernel (tree_pipe_kernel) in TpForm1, or TpForm2 for the fused tree,
// wherever its layout needs hold, else the WMMA kernels; 3 = the warpgroup kernel (tree_wgmma_kernel)
// for the fused tree and the FP32 output with K-contiguous operands, the rest as 1 (the GPU only: the
// host emulation answers cudaErrorNotSupported). Returns the previous form, or -1 (and changes nothing) for another number. The bits do not
// depend on the form (tested).
RL_EXPORT int64_t rl_tree_gemm_form(int64_t form) {
    if (form < 0 || form >= TREE_FORMS) return -1;
    const int64_t old = g_tree_form;
    g_tree_form = static_cast<int>(form);
    return old;
}

// 1 if the pipelined kernel can run rl_det_gemm with these arguments (leaves 0 .. 2^depth - 1; for the
// tests, which must know that the form they compare did run), else 0.
RL_EXPORT int64_t rl_tree_pipe_ok(const void* a, const void* b, int64_t s_am, int64_t s_ak, int64_t s_bk, int64_t s_bn, int64_t depth, int64_t b0, int64_t b1, int64_t b2, int64_t b3) {
    if (depth < 0 || depth > 2) return 0;
    TreeArgs g{static_cast<const bf16*>(a), static_cast<const bf16*>(b), nullptr, 1, 1, 1, s_am, s_ak, s_bk, s_bn, 1, 1,
               {b0, b1, b2, b3, 0}};
    return tree_pipe_ok(g, 1 << depth) ? 1 : 0;
}

// The same for the warp GEMV's geometry (0 .. GW_VARIANTS - 1).
RL_EXPORT int64_t rl_gemv_warp_variant(int64_t v) {
    if (v < 0 || v >= GW_VARIANTS) return -1;
    const int64_t old = g_gemv_warp_variant;
    g_gemv_warp_variant = static_cast<int>(v);
    return old;
}

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
