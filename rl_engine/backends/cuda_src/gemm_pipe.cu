// Pipelined tensor-core tree GEMM of the cuda_bf16 backend, the host side: the process's form
// (rl_tree_gemm_form) and which family's kernel runs a product (tree_pipe_kernel for forms 1 and 2,
// tree_wgmma_kernel for 3, tree_wgmma_ws_kernel for 4, 5, 7 and 8, gemm_wide.cu's for 6), the TMA tensor
// maps, the hi / lo GEMM of linear_logp's tensor-core backward (rl_gemm_hilo) and the settings' exports.
// The kernels are gemm_pipe.cuh's, instantiated by gemm_pipe_tp.cu, gemm_pipe_tw3.cu, gemm_pipe_ws.cu and
// gemm_pipe_ws_aux.cu (compiled in parallel). gemm.cu's launchers call the entry points declared in
// gemm.cuh; the tree itself (leaves, steps, merges) is described there and in gemm.cu's header.
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm.cuh"
#include "gemm_tw.cuh"  // (the tile geometry of tree_wgmma_ok)
#ifndef RL_HOST_EMU
#include <cuda.h>  // CUtensorMap and its enums (the driver function is fetched at run time: no -lcuda)
#endif

using namespace rl;

#ifndef RL_HOST_EMU  // (the host emulator has its own, tests/cuda_emu/emu.cpp)
int rl::tma_map_bf16_2d(TmaMap* map, const void* base, uint64_t inner, uint64_t outer, uint64_t stride_bytes,
                        uint32_t box_inner, uint32_t box_outer) {
    static_assert(sizeof(TmaMap) == sizeof(CUtensorMap) && alignof(TmaMap) >= alignof(CUtensorMap), "TmaMap is a CUtensorMap");
    using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                                const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    static Encode encode = []() -> Encode {
        void* fn = nullptr;
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
            return nullptr;
        return reinterpret_cast<Encode>(fn);
    }();
    if (encode == nullptr || box_inner * 2 != 128) return 1;  // (the 128-byte swizzle: one span per box row)
    const cuuint64_t dims[2] = {inner, outer};
    const cuuint64_t strides[1] = {stride_bytes};
    const cuuint32_t box[2] = {box_inner, box_outer};
    const cuuint32_t unit[2] = {1, 1};
    const CUresult r = encode(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base),
                              dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : static_cast<int>(r);
}
#endif

// Whether tree_pipe_kernel can run this product with leaves [0, leaves) (host side; layout, alignment
// and bounds only, never M).
bool rl::tree_pipe_ok(const TreeArgs& g, int leaves) {
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

// The warpgroup MMA form (3): same bits as form 0 on the H200, 0.37-0.46x cuBLAS against 0.04-0.06x
// (evidence/2026-12-04-h200-issue33-e035223). Form 4 gave form 0's bits on an H100 at every Qwen3-8B
// projection shape and product at 0.44-0.77x cuBLAS (M = 8192; evidence/2026-12-05-h100-det-gemm-ws-50b3bad,
// its persistent grid too), the same on the H200 at 0.49-0.69x (evidence/2026-12-06-h200-form4-fc8dac6), and was
// the default from fc8dac6 (evidence/2026-12-06-h200-gate-fc8dac6). Form 5 (TMA copies) gave the same bits at
// 0.51-0.77x cuBLAS (M = 8192, H100), form 6 (128 x 256 tiles) the same bits at 0.36-0.79x, slower in most
// products (evidence/2026-12-06-h100-form5-form6-716923f); form 5 is the default since the whole gate kept every
// bit with it (evidence/2026-12-06-h100-gate-716923f). Form 7 (form 5 with the depth-2 trees' sibling leaves side
// by side) gave form 5's bits in every sweep row (evidence/2026-12-07-h100-issue34-50f44c6) and, in the 4 x 1024
// train step on an H100, 471.9 ms of kernels against form 5's 485.3 in the same process (the layer GEMMs 319.2
// against 332.2; evidence/2026-12-07-h100-chain-c163ce5): the default since 56d6ddf, whose whole gate kept every
// bit (evidence/2026-12-07-h100-gate-56d6ddf).
int rl::g_tree_form = 7;
int rl::g_tws_persistent = 1;
int64_t rl::g_tws_tma_launches = 0;   // rl_tree_form_launches(5): form 5's launches that ran with TMA copies
int64_t rl::g_tws_pair_launches = 0;  // rl_tree_form_launches(7): form 7's launches with the paired leaves
int64_t rl::g_tws_roll_launches = 0;  // rl_tree_form_launches(8): form 8's launches with the rolled leaves

// Whether tree_wgmma_kernel can run this product with leaves [0, leaves) (host side): the layouts
// (K, K), (K, MN) and (MN, MN) (A, B), 16-byte aligned data, the other stride a multiple of 8, and with
// a K-contiguous operand every leaf bound a multiple of 8.
bool rl::tree_wgmma_ok(const TreeArgs& g, int leaves) {
    static_assert(TW_BM == 128 && TW_BN == 128, "tree_pipe_ok bounds the count of 128 x 128 tiles");
    if (!tree_pipe_ok(g, leaves)) return false;  // layouts, alignment, leaf starts
    const bool a_k = g.s_ak == 1;
    const bool b_k = g.s_bk == 1;
    if (!a_k && b_k) return false;  // (MN, K) is not a product of the training step
    return !(a_k || b_k) || (g.bounds[leaves] & 7) == 0;  // and, K-major, the last leaf's end
}


int rl::launch_pipe_fused(const TreeArgs& g, int depth, cudaStream_t st) {
    if (g_tree_form >= 3 && tree_wgmma_ok(g, 1 << depth)) {
        if (g_tree_form == 6) {  // the fused BF16 trees in 128 x 256 tiles (gemm_wide.cu)
            const int r = launch_wide_fused(g, depth, st);
            if (r >= 0) return r;
        }
        return g_tree_form >= 4 ? tws_fused(g, depth, st) : tw3_tree(g, depth, false, 0, st);
    }
    return tp_fused(g, depth, g_tree_form == 2, st);
}

int rl::launch_pipe_f32(const TreeArgs& g, cudaStream_t st) {
    if (g_tree_form >= 3 && g.s_ak == 1 && g.s_bk == 1 && tree_wgmma_ok(g, 1))  // the logits: (K, K) only
        return g_tree_form >= 4 ? tws_f32(g, st) : tw3_tree(g, 0, true, 0, st);
    return tp_f32(g, st);
}

int rl::launch_pipe_leaves(const TreeArgs& g, int leaves, bf16* w, cudaStream_t st) {
    if (g_tree_form >= 3 && tree_wgmma_ok(g, leaves)) {  // the same leaves on the warpgroup MMA
        TreeArgs gw = g;
        gw.c = w;
        gw.s_cm = g.N;
        gw.s_cn = 1;
        return g_tree_form >= 4 ? tws_leaves(gw, leaves, st) : tw3_tree(gw, 0, false, leaves, st);
    }
    return tp_leaves(g, leaves, w, st);
}

// hi / lo GEMM (the tensor-core form of linear_logp's backward GEMMs, mirroring the Triton backend's
// _bwd_dhidden_kernel / _bwd_dweight_kernel): C [M, N] = acc_in + sum over 64-wide K blocks in increasing
// order of (hi_blk @ B_blk, then lo_blk @ B_blk), hi and lo [M, K] BF16 with the same strides, B [K, N]
// BF16, one FP32 accumulator per output element (tree_pipe_kernel, HILO; in form 3 tree_wgmma_kernel,
// in form 4 tree_wgmma_ws_kernel, HILO, where tree_wgmma_ok holds); acc_in [M, N] FP32 with row
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
    if (g_tree_form >= 3 && tree_wgmma_ok(g, 1))  // the same products on the warpgroup MMA
        return g_tree_form >= 4 ? tws_hilo(g, l, in, s_acc, out_f32 != 0, st) : tw3_hilo(g, l, in, s_acc, out_f32 != 0, st);
    return tp_hilo(g, l, in, s_acc, out_f32 != 0, st);
}

// Pick the form of the GEMMs at training sizes (the fused tree, its leaf-parallel form and the FP32-output
// GEMM, wherever the decode GEMVs do not run) for every later launch of this process: 0 = the WMMA
// kernels, 1 and 2 = the pipelined kernel (tree_pipe_kernel) in TpForm1, or TpForm2 for the fused tree,
// wherever its layout needs hold, else the WMMA kernels; 3 = the warpgroup kernel (tree_wgmma_kernel)
// for the fused tree (layouts (K, K), (K, MN), (MN, MN)) and the (K, K) FP32 output, the rest as 1;
// 4 = those products on the warp-specialised tree_wgmma_ws_kernel; 5 = as 4 with TMA copies; 6 = as 5
// with the fused BF16 trees in 128 x 256 tiles (gemm_wide.cu); 7 = as 5 with the depth-2 fused BF16 trees'
// sibling leaves side by side (tree_wgmma_ws_kernel's PAIR); 8 = as 5 with those trees' leaves rolled (each rounded
// under the next one's first MMAs; ROLL). Returns the previous form, or -1 (and changes
// nothing) for another number. The bits do not depend on the form (tested).
RL_EXPORT int64_t rl_tree_gemm_form(int64_t form) {
    if (form < 0 || form >= TREE_GEMM_FORMS) return -1;
    const int64_t old = g_tree_form;
    g_tree_form = static_cast<int>(form);
    return old;
}

// Form 4's grid for every later launch of this process: 1 = persistent (one block per SM, each looping
// over tiles; the default), 0 = one block per tile. Returns the previous setting, or -1 (and changes
// nothing) for another number. The bits do not depend on it (tested).
RL_EXPORT int64_t rl_tree_wgmma_ws_persistent(int64_t on) {
    if (on != 0 && on != 1) return -1;
    const int64_t old = g_tws_persistent;
    g_tws_persistent = static_cast<int>(on);
    return old;
}

// How many launches of this process ran form 5's own kernel (the warp-specialised one with TMA copies; form
// 7's launches count here too), form 6's (the 128 x 256 tiles) or form 7's (the paired leaves); -1 for
// another form. A product whose tensor maps the driver refuses
// runs form 4's copies instead (for the tests, which must know that the form they compare ran).
RL_EXPORT int64_t rl_tree_form_launches(int64_t form) {
    return form == 5 ? g_tws_tma_launches
         : form == 6 ? g_tww_launches
         : form == 7 ? g_tws_pair_launches
         : form == 8 ? g_tws_roll_launches
                     : -1;
}


// 1 if the pipelined kernel can run rl_det_gemm with these arguments (leaves 0 .. 2^depth - 1; for the
// tests, which must know that the form they compare did run), else 0.
RL_EXPORT int64_t rl_tree_pipe_ok(const void* a, const void* b, int64_t s_am, int64_t s_ak, int64_t s_bk, int64_t s_bn, int64_t depth, int64_t b0, int64_t b1, int64_t b2, int64_t b3) {
    if (depth < 0 || depth > 2) return 0;
    TreeArgs g{static_cast<const bf16*>(a), static_cast<const bf16*>(b), nullptr, 1, 1, 1, s_am, s_ak, s_bk, s_bn, 1, 1,
               {b0, b1, b2, b3, 0}};
    return tree_pipe_ok(g, 1 << depth) ? 1 : 0;
}

