// Shared by the warpgroup-MMA tree GEMM sources of the cuda_bf16 backend (gemm_pipe.cu: forms 1-5,
// gemm_wide.cu: form 6): the fused tree's leaf bounds and packed BF16 pairs, the warpgroup tiles' size
// and order, the TMA tensor maps of a product's leaves, and the epilogues' pair-store test. Everything
// here is internal to each translation unit (an anonymous namespace), as it was in gemm_pipe.cu.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "gemm.cuh"

namespace {

using namespace rl;  // (as the .cu files do)

// Tiles run TP_GROUP_M tile rows at a time down the tile columns, so neighbouring blocks share B.
constexpr int TP_GROUP_M = 8;

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

// The warpgroup forms' tile and ring slot (gemm_pipe.cu's tree_wgmma_kernel describes them).
constexpr int TW_BM = 128;
constexpr int TW_BN = 128;
constexpr int TW_SK = 2 * TB_K;                     // k per ring slot
constexpr int TW_HALF = TW_BM * TW_SK * 2;          // bytes of one operand in a slot
constexpr int TW_SLOT = 2 * TW_HALF;                // A rows, then B rows

// The tile of a block's i-th work item: tree_pipe_kernel's grouped order (TP_GROUP_M tile rows at a time);
// BN: the tile's columns (form 6: 256).
template <int BN = TW_BN>
__device__ __forceinline__ void tw_tile(const TreeArgs& g, int64_t pid, int64_t& m0, int64_t& n0) {
    const int64_t tiles_m = cdiv(g.M, TW_BM);
    const int64_t tiles_n = cdiv(g.N, BN);
    const int64_t group = static_cast<int64_t>(TP_GROUP_M) * tiles_n;
    const int64_t first_m = (pid / group) * TP_GROUP_M;
    const int64_t rows_here = tiles_m - first_m < TP_GROUP_M ? tiles_m - first_m : TP_GROUP_M;
    m0 = (first_m + (pid % group) % rows_here) * TW_BM;
    n0 = ((pid % group) / rows_here) * BN;
}

// Form 5's tensor maps (TMA = true; form 4 passes TwNoMaps): per leaf of the block's tree (at most 4:
// TreeArgs::bounds) one map of A and one of B over the leaf's k range [bounds[l], bounds[l + 1]) only,
// so TMA's zero fill past the tensor's edge is the leaf's zero fill past its end, as cp.async's source
// size gives it in form 4; `lo`: the hi / lo products' lo part of A (over all of K, as a[0] is).
// K-major operand: inner = the leaf's k, outer = the rows (M or N), boxes 64 k x 128 rows; MN-major:
// inner = the rows, outer = the leaf's k, boxes 64 rows x 64 k (two per operand and slot, the two
// swizzle atoms). The same bytes land at the same places as form 4's copies.
struct TwMaps {
    TmaMap a[4];
    TmaMap b[4];
    TmaMap lo;
};
struct TwNoMaps {};

// The tensor maps of forms 5 and 6 (TwMaps) for this product's leaves [0, leaves); BN: B's K-major box
// rows (the tile's columns); false where the driver refuses one (form 4's copies then run).
template <bool A_MN, bool B_MN, int BN = TW_BN>
bool tw_maps(TwMaps& m, const TreeArgs& g, int leaves, const bf16* lo) {
    // one operand's map over k [k0, k1) of rows [0, rows): row stride s_r, k stride s_k (elements)
    auto map = [](TmaMap* t, const bf16* x, bool mn, int64_t rows, int64_t s_r, int64_t s_k, int64_t k0, int64_t k1,
                  uint32_t box_rows) {
        const uint64_t w = static_cast<uint64_t>(k1 - k0);
        if (mn) return tma_map_bf16_2d(t, x + k0 * s_k, static_cast<uint64_t>(rows), w, 2 * static_cast<uint64_t>(s_k), 64, 64) == 0;
        return tma_map_bf16_2d(t, x + k0, w, static_cast<uint64_t>(rows), 2 * static_cast<uint64_t>(s_r), 64, box_rows) == 0;
    };
    for (int l = 0; l < leaves; ++l) {
        const int64_t k0 = g.bounds[l], k1 = g.bounds[l + 1];
        if (k1 <= k0) continue;  // an empty leaf has no slots
        if (!map(&m.a[l], g.a, A_MN, g.M, g.s_am, g.s_ak, k0, k1, TW_BM)) return false;
        if (!map(&m.b[l], g.b, B_MN, g.N, g.s_bn, g.s_bk, k0, k1, BN)) return false;
    }
    return lo == nullptr || map(&m.lo, lo, A_MN, g.M, g.s_am, g.s_ak, 0, g.K, TW_BM);
}

// One operand's TMA boxes of a ring slot at d: ROWS rows (M or N, from row0) x 64 k (from k of the leaf's
// map) as one box of ROWS x 64 k (K-major) or ROWS / 64 boxes of 64 rows x 64 k, the 64-element swizzle
// atoms 8192 bytes apart (MN-major), their bytes completing on the barrier at bar.
template <bool MN, int ROWS>
__device__ __forceinline__ void tw_tma_operand(uint32_t d, const TmaMap* map, int64_t row0, int32_t k, uint32_t bar) {
    if (MN) {
#pragma unroll
        for (int h = 0; h < ROWS / 64; ++h) tma_load_2d(d + 8192 * h, map, static_cast<int32_t>(row0 + 64 * h), k, bar);
    } else {
        tma_load_2d(d, map, k, static_cast<int32_t>(row0), bar);
    }
}

// Ring slot j of a TMA-fed ring of STAGES places of SLOT bytes (A's 128 rows, then B's BN rows at
// TW_HALF): once its place is empty (the `empty` barrier's phase of the slot STAGES before), one
// expect-tx arrival for the slot's bytes on its `full` barrier, then the boxes at k of the leaf's maps.
template <bool A_MN, bool B_MN, int BN, int STAGES, int SLOT>
__device__ __forceinline__ void tw_tma_slot(int j, uint32_t ring, uint32_t full, uint32_t empty, const TmaMap* am,
                                            const TmaMap* bm, int64_t m0, int64_t n0, int64_t k) {
    const int s = j % STAGES;
    if (j >= STAGES) mbar_wait(empty + 8 * s, ((j / STAGES) - 1) & 1);
    const uint32_t d = ring + s * SLOT;
    const uint32_t bar = full + 8 * s;
    mbar_arrive_expect_tx(bar, SLOT);
    tw_tma_operand<A_MN, TW_BM>(d, am, m0, static_cast<int32_t>(k), bar);
    tw_tma_operand<B_MN, BN>(d + TW_HALF, bm, n0, static_cast<int32_t>(k), bar);
}

// Whether neighbouring output columns are one aligned store apart (4 bytes for BF16, 8 for FP32): the
// epilogues' `pairs` argument.
inline int tp_pairs(const void* out, int64_t s_om, int64_t s_on, bool out_f32) {
    const uintptr_t align = out_f32 ? 7u : 3u;
    return s_on == 1 && (s_om % 2) == 0 && (reinterpret_cast<uintptr_t>(out) & align) == 0;
}

}  // namespace
