// Form 6 of the cuda_bf16 backend's training-size GEMMs (rl_tree_gemm_form): the fused BF16 trees in
// 128 x 256 tiles (tree_wgmma_wide_kernel), in a translation unit of its own so that it compiles beside
// gemm_pipe.cuh's families (the build compiles the .cu files in parallel). gemm_pipe.cu calls rl::launch_wide_fused.
#include <cstdint>

#include "common.cuh"
#include "gemm.cuh"
#include "gemm_tw.cuh"

using namespace rl;

int64_t rl::g_tww_launches = 0;

namespace {


// Form 5 with 256-column tiles for the fused BF16 trees (the leaf-parallel leaves, FP32 outputs and
// hi / lo products run as form 5): each MMA warpgroup multiplies 64 rows x 256 columns with wgmma
// m64n256k16 (128 FP32 accumulators per thread) from ring slots of 64 k x (128 A rows + 256 B rows),
// 48 KB, filled by TMA as form 5's (B's boxes 256 rows K-major, four 64-wide swizzle atoms MN-major).
// A slot's 48 KB of L2 reads feed twice the products of form 5's 32 KB (ncu of form 5: the L2 the
// busiest unit). Same leaves, k16 products in the same order, roundings and merges per output element,
// so the same bits. Registers: the accumulators and one held set of rounded pairs (64 per thread) fit
// under setmaxnreg; a depth-2 tree's first merged sum (l0 + l1) leaves them for its output places in C
// after leaf 1, and the same thread reads it back (its own writes) for the last merge.
constexpr int TWW_BN = 256;
constexpr int TWW_THREADS = 384;  // a copy warpgroup, then two MMA warpgroups (form 4's block)
constexpr int TWW_SLOT = TW_HALF + TWW_BN * TW_SK * 2;  // A's 128 rows (16 KB), then B's 256 rows (32 KB)
constexpr int TWW_STAGES = 4;
constexpr int TWW_SMEM = TWW_STAGES * TWW_SLOT + 2 * TWW_STAGES * 8;  // the ring, then full[], empty[]
// Registers per thread after the split (setmaxnreg; the launch allocates 168): one thread issues the TMA
// copies, and the MMA warpgroups take the rest (ptxas -v, nvcc 13.0: bytes spilled by the depth-1 / 2
// kernels 176 / 264 at 40 / 232, 132-156 / 200 at 24 / 240, all of them outside the MMA slot loops and
// the copying thread's TMA issue (nvdisasm of the depth-2 kernel: no local load or store in a loop that
// holds the HGMMA instructions' slot loop)).
constexpr int TWW_COPY_REGS = 24;
constexpr int TWW_MMA_REGS = 240;
static_assert(128 * TWW_COPY_REGS + 256 * TWW_MMA_REGS <= TWW_THREADS * 168, "setmaxnreg beyond the launch's registers");
static_assert(TWW_SLOT % 1024 == 0, "ring slots on 1024-byte boundaries (the 128-byte swizzle)");


// A warp's 16 rows x 256 columns of rounded pairs h (pair q = 2 j + p: column group j, row half p, as
// tw_store's) to (LOAD false) or from (LOAD true) their places in the BF16 output g.c; a pair's second
// column past N is neither stored nor read (read as 0).
template <bool LOAD>
__device__ __forceinline__ void tww_pairs_io(const TreeArgs& g, uint32_t (&h)[64], int64_t row0, int64_t n0, int pairs) {
    tw_for_pairs<TWW_BN>(g, row0, n0, [&](int q, int64_t r, int64_t c) {
        bf16* o = static_cast<bf16*>(g.c) + r * g.s_cm + c * g.s_cn;
        const bool two = c + 1 < g.N;
        if (LOAD) {
            if (two && pairs) h[q] = *reinterpret_cast<const uint32_t*>(o);
            else h[q] = tp_pack(o[0], two ? o[g.s_cn] : to_bf16(0.0f));
        } else if (two && pairs) {
            *reinterpret_cast<uint32_t*>(o) = h[q];
        } else {
            o[0] = tp_lo(h[q]);
            if (two) o[g.s_cn] = tp_hi(h[q]);
        }
    });
}

template <int DEPTH, bool A_MN, bool B_MN>
__global__ void __launch_bounds__(TWW_THREADS, 1)
    tree_wgmma_wide_kernel(TreeArgs g, int pairs, const __grid_constant__ TwMaps maps) {
    constexpr int NL = 1 << DEPTH;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int tid = threadIdx.x;
    const int wg = tid >> 7;  // 0: copies; 1, 2: rows 64 (wg - 1) .. + 63 of the tile
    const int64_t tiles = cdiv(g.M, TW_BM) * cdiv(g.N, TWW_BN);

    const uint32_t ring = smem_u32(smem_raw);
    if (ring & 1023u) __trap();  // dynamic shared memory starts 1024-byte aligned
    const uint32_t full = ring + TWW_STAGES * TWW_SLOT;
    const uint32_t empty = full + 8 * TWW_STAGES;
    if (tid == 0) {
        for (int s = 0; s < TWW_STAGES; ++s) {
            mbar_init(full + 8 * s, 1);   // the copying thread's expect-tx arrival
            mbar_init(empty + 8 * s, 2);  // one arrival per MMA warpgroup
        }
        fence_mbar_init();
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<TWW_COPY_REGS>();
        if (tid != 0) return;
        int j = 0;
        for (int64_t pid = blockIdx.x; pid < tiles; pid += gridDim.x) {
            int64_t m0, n0;
            tw_tile<TWW_BN>(g, pid, m0, n0);
            for (int lf = 0; lf < NL; ++lf)
                for (int64_t k0 = 0; k0 < tp_bound(g, lf + 1) - tp_bound(g, lf); k0 += TW_SK)
                    tw_tma_slot<A_MN, B_MN, TWW_BN, TWW_STAGES, TWW_SLOT>(j++, ring, full, empty, &maps.a[lf], &maps.b[lf], m0, n0, k0);
        }
        return;
    }

    setmaxnreg_inc<TWW_MMA_REGS>();
    const int cw = wg - 1;
    const int warp = (tid >> 5) & 3;
    const bool leader = (tid & 127) == 0;
    const uint64_t desc0 = A_MN ? wg_desc_sw128_mn(ring + cw * 8192, 8192) : wg_desc_sw128(ring + cw * (64 * 128));
    const uint64_t descb0 = B_MN ? wg_desc_sw128_mn(ring + TW_HALF, 8192) : wg_desc_sw128(ring + TW_HALF);
    float acc[128];
    uint32_t h[64];
    int consumed = 0;
    int released = 0;
    for (int64_t pid = blockIdx.x; pid < tiles; pid += gridDim.x) {
        int64_t m0, n0;
        tw_tile<TWW_BN>(g, pid, m0, n0);
        const int64_t row0 = m0 + 64 * cw + 16 * warp;
#pragma unroll
        for (int l = 0; l < NL; ++l) {
            const int64_t width = tp_bound(g, l + 1) - tp_bound(g, l);
            const int64_t steps = cdiv(width, static_cast<int64_t>(TB_K));
            const int64_t slots = cdiv(width, static_cast<int64_t>(TW_SK));
#pragma unroll
            for (int e = 0; e < 128; ++e) acc[e] = 0.0f;
            tw_leaf_mmas<A_MN, B_MN, TWW_STAGES, TWW_SLOT, true>(acc, slots, steps, consumed, released, full, empty, desc0,
                                                            descb0, leader);
            // the leaf rounded to BF16 pairs and merged as tw_hold's ((l0 + l1) + (l2 + l3)), with l0 + l1
            // parked in C during leaves 2 and 3 of a depth-2 tree
#pragma unroll
            for (int q = 0; q < 64; ++q) {
                const uint32_t v = tp_round2(acc[2 * q], acc[2 * q + 1]);
                h[q] = (l == 1 || l == 3) ? tp_merge2(h[q], v) : v;  // l0 + l1; l2 + l3 (h holds l2)
            }
            if (DEPTH == 2 && l == 1) tww_pairs_io<false>(g, h, row0, n0, pairs);
            if (DEPTH == 2 && l == 3) {
                uint32_t h0[64];
                tww_pairs_io<true>(g, h0, row0, n0, pairs);
#pragma unroll
                for (int q = 0; q < 64; ++q) h[q] = tp_merge2(h0[q], h[q]);
            }
        }
        tww_pairs_io<false>(g, h, row0, n0, pairs);
    }
}

template <int DEPTH, bool A_MN, bool B_MN>
int launch_tree_wgmma_wide_as(const TreeArgs& g, cudaStream_t st, const TwMaps& maps) {
    auto kernel = tree_wgmma_wide_kernel<DEPTH, A_MN, B_MN>;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, TWW_SMEM))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, TW_BM) * cdiv(g.N, TWW_BN);
    int64_t blocks = tiles;
    if (g_tws_persistent) {
        int dev = 0, sms = 0;
        if (cudaError_t e = cudaGetDevice(&dev)) return static_cast<int>(e);
        if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) return static_cast<int>(e);
        if (sms < blocks) blocks = sms;
    }
    ++g_tww_launches;
    kernel<<<static_cast<unsigned>(blocks), TWW_THREADS, TWW_SMEM, st>>>(g, tp_pairs(g.c, g.s_cm, g.s_cn, false), maps);
    return launch_status();
}

template <int DEPTH, bool A_MN, bool B_MN>
int launch_wide_as(const TreeArgs& g, cudaStream_t st) {
    TwMaps maps{};  // (copied into the launch's parameters)
    if (!tw_maps<A_MN, B_MN, TWW_BN>(maps, g, 1 << DEPTH, nullptr)) return -1;
    return launch_tree_wgmma_wide_as<DEPTH, A_MN, B_MN>(g, st, maps);
}

template <int DEPTH>
int launch_wide_depth(const TreeArgs& g, cudaStream_t st) {
    if (g.s_ak == 1) return g.s_bk == 1 ? launch_wide_as<DEPTH, false, false>(g, st) : launch_wide_as<DEPTH, false, true>(g, st);
    return launch_wide_as<DEPTH, true, true>(g, st);
}

}  // namespace

int rl::launch_wide_fused(const TreeArgs& g, int depth, cudaStream_t st) {
    if (g.s_ak != 1 && g.s_bk == 1) return -1;  // (MN, K) is not a product of the training step
    if (depth == 0) return launch_wide_depth<0>(g, st);
    if (depth == 1) return launch_wide_depth<1>(g, st);
    if (depth == 2) return launch_wide_depth<2>(g, st);
    return -1;
}
