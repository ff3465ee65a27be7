// tree_pipe_kernel's instances (forms 1 and 2 of rl_tree_gemm_form, and the products forms 3 and later
// leave to it): the fused BF16 tree, the FP32-output GEMM, the leaf-parallel leaves and hi / lo
// (gemm_pipe.cuh has the kernel; gemm_pipe.cu picks the form).
#include "gemm_pipe.cuh"

namespace {

// The fused bf16 tree of depth 0 .. 2 in tree_pipe_kernel's geometry G.
template <class G>
int launch_tree_pipe_fused(const TreeArgs& g, int depth, cudaStream_t st) {
    if (depth == 0) return launch_tree_pipe<G, 0, false, false>(g, 1, g.c, g.s_cm, g.s_cn, st);
    if (depth == 1) return launch_tree_pipe<G, 1, false, false>(g, 1, g.c, g.s_cm, g.s_cn, st);
    return launch_tree_pipe<G, 2, false, false>(g, 1, g.c, g.s_cm, g.s_cn, st);
}

}  // namespace

int rl::tp_fused(const TreeArgs& g, int depth, bool wide, cudaStream_t st) {
    return wide ? launch_tree_pipe_fused<TpForm2>(g, depth, st) : launch_tree_pipe_fused<TpForm1>(g, depth, st);
}

int rl::tp_f32(const TreeArgs& g, cudaStream_t st) {
    return launch_tree_pipe<TpForm1, 0, true, false>(g, 1, g.c, g.s_cm, g.s_cn, st);
}

int rl::tp_leaves(const TreeArgs& g, int leaves, bf16* w, cudaStream_t st) {
    return launch_tree_pipe<TpForm1, 0, false, true>(g, leaves, w, g.N, 1, st);
}

int rl::tp_hilo(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, bool out_f32, cudaStream_t st) {
    if (g.s_ak != 1) {
        return out_f32 ? launch_hilo_as<true, true, true>(g, lo, acc_in, s_acc, st)
                       : launch_hilo_as<false, true, true>(g, lo, acc_in, s_acc, st);
    }
    return out_f32 ? launch_hilo_as<true, false, true>(g, lo, acc_in, s_acc, st)
                   : launch_hilo_as<false, false, true>(g, lo, acc_in, s_acc, st);
}
