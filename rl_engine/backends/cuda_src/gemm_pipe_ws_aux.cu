// tree_wgmma_ws_kernel's instances for the FP32-output GEMM, the leaf-parallel leaves and hi / lo (forms 4
// and later of rl_tree_gemm_form; gemm_pipe.cuh has the kernel, gemm_pipe.cu picks the form; the fused BF16
// trees are gemm_pipe_ws.cu's).
#include "gemm_pipe.cuh"

int rl::tws_f32(const TreeArgs& g, cudaStream_t st) {
    return launch_tree_wgmma_ws_as<0, true, false, false>(g, st);  // the logits: (K, K) only
}

int rl::tws_leaves(const TreeArgs& g, int leaves, cudaStream_t st) {
    return tw_with_layout(g, [&](auto a, auto b) {
        return launch_tree_wgmma_ws_as<0, false, a.value, b.value, true>(g, st, leaves);
    });
}

int rl::tws_hilo(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, bool out_f32, cudaStream_t st) {
    if (g.s_ak != 1) {
        return out_f32 ? launch_tree_wgmma_ws_as<0, true, true, true, false, true>(g, st, 1, lo, acc_in, s_acc)
                       : launch_tree_wgmma_ws_as<0, false, true, true, false, true>(g, st, 1, lo, acc_in, s_acc);
    }
    return out_f32 ? launch_tree_wgmma_ws_as<0, true, false, true, false, true>(g, st, 1, lo, acc_in, s_acc)
                   : launch_tree_wgmma_ws_as<0, false, false, true, false, true>(g, st, 1, lo, acc_in, s_acc);
}
