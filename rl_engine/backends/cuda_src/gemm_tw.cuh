// Shared by the warpgroup-MMA tree GEMM sources of the cuda_bf16 backend (gemm_pipe.cuh: forms 1-5, 7, 8,
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

#ifndef RL_HOST_EMU  // (the host emulator, tests/cuda_emu/emu.h, has its own)
// d[64] += A (64 x 16, descriptor da) @ B (16 x 128, descriptor db), FP32 accumulation; TA / TB: the
// operand is MN-major (the instruction's transpose flags). Fragment as wgmma_n64's, with 16 column
// groups of 8.
template <int TA, int TB>
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
        "%64, %65, p, 1, 1, %67, %68;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
}
#endif
#ifndef RL_HOST_EMU  // (the host emulator, tests/cuda_emu/emu.h, has its own)
// d[128] += A (64 x 16, descriptor da) @ B (16 x 256, descriptor db): wgmma_n128's instruction with 32
// column groups of 8 (form 6's 128 x 256 tiles).
template <int TA, int TB>
__device__ __forceinline__ void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, %131, %132;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
}
#endif

// The warpgroup MMA of an accumulator set's width: m64n128k16 for 64 accumulators, m64n256k16 for 128.
template <int TA, int TB>
__device__ __forceinline__ void wgmma_nacc(float (&d)[64], uint64_t da, uint64_t db) { wgmma_n128<TA, TB>(d, da, db); }
template <int TA, int TB>
__device__ __forceinline__ void wgmma_nacc(float (&d)[128], uint64_t da, uint64_t db) { wgmma_n256<TA, TB>(d, da, db); }

// Slot i's MMAs for a warpgroup (NACC accumulators: 64 with m64n128k16, 128 with m64n256k16): steps 2 i (k 0..15, 16..31 of the slot) and 2 i + 1 (k 32..63) unless
// the leaf has only `steps` < 2 i + 2 (uniform: no step past the leaf's last), one commit, then the wait
// for the MMAs of the slot before. Each branch issues and commits a whole group: with the branch
// around the last two MMAs alone (as until 2026-12-07), ptxas closed a group before the branch and
// another after it, and put the commit on an empty MMA of its own (SASS: HGMMA.64x8x16 RZ with gsb0),
// so "wait until at most one group is pending" left only that empty one pending and waited for the
// slot's own MMAs: no warpgroup had a slot's MMAs in flight while it waited for the next slot. The
// same MMAs in the same order either way (the same bits).
template <bool A_MN, bool B_MN, int NACC>
__device__ __forceinline__ void tw_slot_mmas(float (&acc)[NACC], uint64_t da, uint64_t db, int64_t i, int64_t steps) {
    static_assert(NACC == 64 || NACC == 128, "m64n128k16 (forms 3-5) or m64n256k16 (form 6)");
    constexpr uint64_t A_K16 = A_MN ? 2048 >> 4 : 32 >> 4;  // a k16 product 32 bytes (K-major) or
    constexpr uint64_t B_K16 = B_MN ? 2048 >> 4 : 32 >> 4;  // 16 k rows = 2048 bytes (MN-major) further on
    constexpr int TA = A_MN ? 1 : 0;
    constexpr int TB = B_MN ? 1 : 0;
    if (2 * i + 1 < steps) {
        wg_fence();
        wgmma_nacc<TA, TB>(acc, da, db);
        wgmma_nacc<TA, TB>(acc, da + A_K16, db + B_K16);
        wgmma_nacc<TA, TB>(acc, da + 2 * A_K16, db + 2 * B_K16);
        wgmma_nacc<TA, TB>(acc, da + 3 * A_K16, db + 3 * B_K16);
        wg_commit();
    } else {
        wg_fence();
        wgmma_nacc<TA, TB>(acc, da, db);
        wgmma_nacc<TA, TB>(acc, da + A_K16, db + B_K16);
        wg_commit();
    }
    wg_wait1();  // this warpgroup's MMAs of the slot before have completed
}

// The MMA warpgroup's side of a warp-specialised ring (forms 4-7; STAGES places of SLOT bytes, the
// `full` / `empty` barriers 8 bytes apart). tw_consume_slot: wait until ring slot `consumed` has
// landed, issue its MMAs into acc (tw_slot_mmas: product i of a leaf of `steps` k32 steps) and give
// back the slot before it, whose MMAs wg_wait1 has seen complete; the caller then counts the slot
// (++consumed). tw_leaf_mmas: one leaf's `slots` slots, then wait for every MMA in flight and give
// back the rest. `consumed` / `released` count this warpgroup's slots across leaves and tiles.
// FENCE: a fence.proxy.async after the `full` wait, for rings filled by cp.async (form 4), whose writes
// are the generic proxy's while wgmma reads shared memory through the async proxy. A ring filled by TMA
// (cp.async.bulk.tensor: the async proxy writes, and the mbarrier's transaction count completing makes
// them visible to the threads that observe the phase) needs none between the wait and the MMAs.
template <bool A_MN, bool B_MN, int STAGES, int SLOT, bool FENCE, int NACC>
__device__ __forceinline__ void tw_consume_slot(float (&acc)[NACC], int64_t i, int64_t steps, int& consumed,
                                                int& released, uint32_t full, uint32_t empty, uint64_t desc0,
                                                uint64_t descb0, bool leader) {
    const int s = consumed % STAGES;
    mbar_wait(full + 8 * s, (consumed / STAGES) & 1);  // the slot's copies have landed
    if constexpr (FENCE) fence_proxy_async();  // ... and cp.async's are visible to the warpgroup MMA's reads
    const uint64_t off = static_cast<uint64_t>((s * SLOT) >> 4);
    tw_slot_mmas<A_MN, B_MN>(acc, desc0 + off, descb0 + off, i, steps);
    if (released < consumed) {
        if (leader) mbar_arrive(empty + 8 * (released % STAGES));
        ++released;
    }
}

template <bool A_MN, bool B_MN, int STAGES, int SLOT, bool FENCE, int NACC>
__device__ __forceinline__ void tw_leaf_mmas(float (&acc)[NACC], int64_t slots, int64_t steps, int& consumed,
                                             int& released, uint32_t full, uint32_t empty, uint64_t desc0,
                                             uint64_t descb0, bool leader) {
    for (int64_t i = 0; i < slots; ++i, ++consumed)
        tw_consume_slot<A_MN, B_MN, STAGES, SLOT, FENCE>(acc, i, steps, consumed, released, full, empty, desc0, descb0, leader);
    wg_wait0();  // the leaf's sums are in acc, and every slot's MMAs have read their operands
    for (; released < consumed; ++released)
        if (leader) mbar_arrive(empty + 8 * (released % STAGES));
}

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

// Form 7's order of the ring slots of sibling leaves p and p + 1 (p even; no leaf-parallel workspace, so
// the tree's leaves are 0 .. 3): slot i of leaf p, then slot i of leaf p + 1, for i = 0, 1, ... while
// either leaf has one (a leaf of w k has cdiv(w, TW_SK) slots, none when empty). f(leaf, i); the copy
// warpgroup and the MMA warpgroups both walk this order, so a ring place holds what its consumer expects.
template <class F>
__device__ __forceinline__ void tw_pair_slots(const TreeArgs& g, int p, F&& f) {
    const int64_t n0 = cdiv(tp_bound(g, p + 1) - tp_bound(g, p), static_cast<int64_t>(TW_SK));
    const int64_t n1 = cdiv(tp_bound(g, p + 2) - tp_bound(g, p + 1), static_cast<int64_t>(TW_SK));
    const int64_t n = n0 > n1 ? n0 : n1;
    for (int64_t i = 0; i < n; ++i) {
        if (i < n0) f(p, i);
        if (i < n1) f(p + 1, i);
    }
}

// The output places of a warp's 16 rows x BN columns of a warpgroup tile (row0: the warp's first row,
// n0 the tile's first column) in the wgmma accumulator fragment's order: f(q, r, c) for pair q = 2 j + p
// (column group j, row half p: row row0 + lane / 4 + 8 p, columns c and c + 1 = n0 + 8 j + 2 (lane % 4)
// and the next), skipping pairs whose row or first column lies outside [M, N).
template <int BN, class F>
__device__ __forceinline__ void tw_for_pairs(const TreeArgs& g, int64_t row0, int64_t n0, F&& f) {
    const int lane = threadIdx.x & 31;
    const int gq = lane >> 2;
    const int t = lane & 3;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int64_t r = row0 + gq + 8 * p;
            const int64_t c = n0 + 8 * j + 2 * t;
            if (r >= g.M || c >= g.N) continue;
            f(2 * j + p, r, c);
        }
}

// Whether neighbouring output columns are one aligned store apart (4 bytes for BF16, 8 for FP32): the
// epilogues' `pairs` argument.
inline int tp_pairs(const void* out, int64_t s_om, int64_t s_on, bool out_f32) {
    const uintptr_t align = out_f32 ? 7u : 3u;
    return s_on == 1 && (s_om % 2) == 0 && (reinterpret_cast<uintptr_t>(out) & align) == 0;
}

}  // namespace
