// tree_wgmma_ws_kernel's instances for the fused BF16 trees (forms 4, 5, 7 and 8 of rl_tree_gemm_form) and
// rl_det_gemm_swiglu (gemm_pipe.cuh has the kernel, gemm_pipe.cu picks the form; the FP32 outputs, the
// leaf-parallel leaves and hi / lo are gemm_pipe_ws_aux.cu's).
#include "gemm_pipe.cuh"

namespace {

template <int DEPTH>
int launch_tws_fused(const TreeArgs& g, cudaStream_t st) {
    return tw_with_layout(g, [&](auto a, auto b) { return launch_tree_wgmma_ws_as<DEPTH, false, a.value, b.value>(g, st); });
}

}  // namespace

int rl::tws_fused(const TreeArgs& g, int depth, cudaStream_t st) {
    if (depth == 0) return launch_tws_fused<0>(g, st);
    if (depth == 1) return launch_tws_fused<1>(g, st);
    return launch_tws_fused<2>(g, st);
}

// The gate / up projections and SwiGLU of a Qwen3 MLP in one launch (tree_wgmma_ws_kernel's SWIGLU):
// y [M, F] bf16 = swiglu(A @ B[:, 0 .. F), A @ B[:, F .. 2F)), both products the depth-2 fused tree over
// the leaf bounds b0 .. b4 of K, swiglu in FP32 rounded once: the bits of rl_det_gemm into [M, 2F] then
// rl_swiglu_fwd on its two halves, without writing the projections. A [M, K] and B [K, 2F] K-major (unit
// stride along K: x and the packed weight [2F, K] transposed; row / column strides s_am, s_bn), y with
// row stride s_ym and unit column stride. rl_det_gemm_swiglu_ok: 1 where it can run (training-size form
// 5 or later, tree_wgmma_ok's layout and leaf bounds for all 2F columns, tensor maps the driver takes),
// else 0 (the caller runs rl_det_gemm and rl_swiglu_fwd); rl_det_gemm_swiglu returns
// cudaErrorInvalidValue before any launch where _ok says 0.
namespace {
int64_t g_swiglu_launches = 0;

// The product's arguments over all 2F columns of B, and its tensor maps; false where it cannot run.
bool swiglu_args(TreeArgs& g, TwMaps& maps, const void* a, const void* b, void* y, int64_t M, int64_t F, int64_t K,
                 int64_t s_am, int64_t s_bn, int64_t s_ym, const int64_t (&bounds)[5]) {
    g = TreeArgs{static_cast<const bf16*>(a), static_cast<const bf16*>(b), y, M, 2 * F, K, s_am, 1, 1, s_bn, s_ym, 1,
                 {bounds[0], bounds[1], bounds[2], bounds[3], bounds[4]}};
    if (g_tree_form < 5 || M <= 0 || F <= 0 || K <= 0 || bounds[0] != 0 || bounds[4] != K) return false;
    for (int i = 0; i < 4; ++i)
        if (bounds[i + 1] < bounds[i]) return false;
    return tree_wgmma_ok(g, 4) && tw_maps<false, false>(maps, g, 4, nullptr);
}
}  // namespace

RL_EXPORT int64_t rl_det_gemm_swiglu_ok(const void* a, const void* b, int64_t M, int64_t F, int64_t K, int64_t s_am, int64_t s_bn, int64_t b0, int64_t b1, int64_t b2, int64_t b3, int64_t b4) {
    TreeArgs g{};
    TwMaps maps{};
    return swiglu_args(g, maps, a, b, nullptr, M, F, K, s_am, s_bn, 0, {b0, b1, b2, b3, b4}) ? 1 : 0;
}

RL_EXPORT int rl_det_gemm_swiglu(const void* a, const void* b, void* y, int64_t M, int64_t F, int64_t K, int64_t s_am, int64_t s_bn, int64_t s_ym, int64_t b0, int64_t b1, int64_t b2, int64_t b3, int64_t b4, void* stream) {
    TreeArgs g{};
    TwMaps maps{};  // over all 2F columns of B (copied into the launch's parameters)
    if (!swiglu_args(g, maps, a, b, y, M, F, K, s_am, s_bn, s_ym, {b0, b1, b2, b3, b4}))
        return static_cast<int>(cudaErrorInvalidValue);
    g.N = F;  // the tiles and stores: y's columns
    ++g_swiglu_launches;
    return launch_tree_wgmma_ws_grid<2, false, false, false, false, false, true, TwMaps, false, true>(
        g, static_cast<cudaStream_t>(stream), 1, nullptr, nullptr, F, maps);
}

// How many launches of this process ran rl_det_gemm_swiglu's kernel (for the tests).
RL_EXPORT int64_t rl_det_gemm_swiglu_launches() { return g_swiglu_launches; }
