// tree_wgmma_kernel's instances (form 3 of rl_tree_gemm_form; gemm_pipe.cuh has the kernel, gemm_pipe.cu
// picks the form).
#include "gemm_pipe.cuh"

namespace {

// LEAVES: one block per (tile, leaf) of [0, leaves) into the workspace g.c (tree_wgmma_kernel's LEAVES).
template <int DEPTH, bool OUT_F32, bool A_MN, bool B_MN, bool LEAVES = false>
int launch_tw3_as(const TreeArgs& g, cudaStream_t st, int leaves = 1) {
    auto kernel = tree_wgmma_kernel<DEPTH, OUT_F32, A_MN, B_MN, false, LEAVES>;
    constexpr int smem = TW_STAGES * TW_SLOT;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, TW_BM) * cdiv(g.N, TW_BN);
    const int pairs = tp_pairs(g.c, g.s_cm, g.s_cn, OUT_F32);
    const dim3 grid(static_cast<unsigned>(tiles), 1, static_cast<unsigned>(LEAVES ? leaves : 1));
    kernel<<<grid, TW_THREADS, smem, st>>>(g, pairs, nullptr, nullptr, 0);
    return launch_status();
}

template <bool OUT_F32, bool A_MN>
int launch_tw3_hilo_as(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, cudaStream_t st) {
    auto kernel = tree_wgmma_kernel<0, OUT_F32, A_MN, true, true>;
    constexpr int smem = TW_STAGES * TW_SLOT;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, TW_BM) * cdiv(g.N, TW_BN);
    const int pairs = tp_pairs(g.c, g.s_cm, g.s_cn, OUT_F32);
    kernel<<<static_cast<unsigned>(tiles), TW_THREADS, smem, st>>>(g, pairs, lo, acc_in, s_acc);
    return launch_status();
}

template <int DEPTH>
int launch_tw3_fused(const TreeArgs& g, cudaStream_t st) {
    return tw_with_layout(g, [&](auto a, auto b) { return launch_tw3_as<DEPTH, false, a.value, b.value>(g, st); });
}

}  // namespace

int rl::tw3_tree(const TreeArgs& g, int depth, bool out_f32, int leaves, cudaStream_t st) {
    if (out_f32) return launch_tw3_as<0, true, false, false>(g, st);  // the logits: (K, K) only
    if (leaves > 0)
        return tw_with_layout(g, [&](auto a, auto b) { return launch_tw3_as<0, false, a.value, b.value, true>(g, st, leaves); });
    if (depth == 0) return launch_tw3_fused<0>(g, st);
    if (depth == 1) return launch_tw3_fused<1>(g, st);
    return launch_tw3_fused<2>(g, st);
}

int rl::tw3_hilo(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, bool out_f32, cudaStream_t st) {
    if (g.s_ak != 1) {
        return out_f32 ? launch_tw3_hilo_as<true, true>(g, lo, acc_in, s_acc, st)
                       : launch_tw3_hilo_as<false, true>(g, lo, acc_in, s_acc, st);
    }
    return out_f32 ? launch_tw3_hilo_as<true, false>(g, lo, acc_in, s_acc, st)
                   : launch_tw3_hilo_as<false, false>(g, lo, acc_in, s_acc, st);
}
