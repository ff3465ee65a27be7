// Shared by the GEMM sources of the cuda_bf16 backend (gemm.cu, gemm_pipe*.cu): the tree GEMM's
// arguments, its K step, the warpgroup-MMA helpers, and the pipelined kernels' entry points.
#pragma once

#include "common.cuh"

namespace rl {

constexpr int TB_K = 32;  // the K step of every tree GEMM form (two k16 MMAs)

// C [M, N] = tree(A [M, K] @ B [K, N]) with element strides; the leaves are [bounds[i], bounds[i + 1]).
struct TreeArgs {
    const bf16* a;
    const bf16* b;
    void* c;
    int64_t M, N, K;
    int64_t s_am, s_ak, s_bk, s_bn, s_cm, s_cn;
    int64_t bounds[5];  // leaf bounds: 2^DEPTH + 1 entries used
};

// A TMA tensor map (CUDA driver API CUtensorMap: 128 opaque bytes, 128-byte aligned), passed to kernels
// by value as a __grid_constant__ parameter.
struct alignas(128) TmaMap {
    unsigned char opaque[128];
};
// A 2-D BF16 tensor map (host side): `inner` contiguous elements per row, `outer` rows `stride_bytes`
// apart, from `base`; boxes of box_inner (64: the 128-byte swizzle span) x box_outer elements land in
// shared memory in the 128-byte swizzle layout (the wgmma descriptors' layout), elements outside the
// tensor filled with zeros. Returns 0, or nonzero where the driver refuses the map (the caller then runs
// its cp.async form).
int tma_map_bf16_2d(TmaMap* map, const void* base, uint64_t inner, uint64_t outer, uint64_t stride_bytes,
                    uint32_t box_inner, uint32_t box_outer);

// Matrix descriptor (PTX ISA, "Matrix Descriptor Format") of a K-major operand in the 128-byte
// swizzle layout: start address in 16-byte units (14 bits), leading byte offset 16 (unused by this
// layout), stride byte offset 1024 (between 8-row groups), base offset 0, layout type 1 (128-byte
// swizzle, bits 62-63). Adding (bytes >> 4) moves the start address as long as it stays inside
// shared memory (< 256 KB); the operand must start on a 1024-byte boundary.
__device__ __forceinline__ uint64_t wg_desc_sw128(uint32_t addr) {
    return static_cast<uint64_t>((addr >> 4) & 0x3FFFu) | (static_cast<uint64_t>(1) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
// Matrix descriptor of an MN-major operand in the 128-byte swizzle layout (PTX ISA, "Matrix
// Descriptor Format"; wg_desc_sw128 is the K-major one): leading byte offset = the stride between
// 64-element swizzle atoms along M / N, stride byte offset 1024 (between groups of 8 k rows).
__device__ __forceinline__ uint64_t wg_desc_sw128_mn(uint32_t addr, uint32_t atom_stride) {
    return static_cast<uint64_t>((addr >> 4) & 0x3FFFu) | (static_cast<uint64_t>((atom_stride >> 4) & 0x3FFFu) << 16) |
           (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

#ifndef RL_HOST_EMU  // (the host emulator, tests/cuda_emu/emu.h, has its own)
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Shared-memory barriers (PTX ISA, "mbarrier"; at a shared-window address, 8-byte aligned): init with
// the arrival count of a phase; arrive; the arrival of a thread's cp.async copies once they have all
// landed (.noinc: counted in the init count); wait until the phase of the given parity has completed.
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// The warpgroup's register budget per thread from here on (PTX ISA, setmaxnreg; a multiple of 8 in
// 24 .. 256, executed by every thread of the warpgroup).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
// Makes the barriers' initialisation visible to the asynchronous proxy (TMA's complete_tx) before they
// are used (PTX ISA, fence.mbarrier_init; with the block barrier after it).
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// An arrival that also expects `bytes` more of asynchronous copies (TMA) to complete in this phase
// (PTX ISA, mbarrier.arrive.expect_tx; the phase completes when both counts are spent).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One TMA copy (PTX ISA, cp.async.bulk.tensor, tile mode) of the box at coordinates (c0 inner, c1 outer)
// of a 2-D tensor map into shared memory at dst (a shared-window address), completing its bytes on the
// barrier at bar. The map is a kernel parameter (__grid_constant__), addressed generically.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const TmaMap* map, int32_t c0, int32_t c1, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
        ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// d[32] (+)= A (64 x 16, K-major descriptor da) @ B (16 x 64, K-major descriptor db); accumulate 0: d is
// not read (scale-d 0). Accumulator fragment (PTX ISA, m64nNk16): warp w holds rows 16 w .. 16 w + 15; for 8-column
// group j, lane 4 g + t holds (16 w + g, 8 j + 2 t + {0, 1}) in d[4 j], d[4 j + 1] and row + 8 in
// d[4 j + 2], d[4 j + 3]. (gemm.cu's GEMV and attention_tc.cu.)
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(accumulate));
}
#endif

// The training-size GEMM form of the process (rl_tree_gemm_form; gemm_pipe.cu): 0 = the WMMA kernels,
// 1 and 2 = tree_pipe_kernel (2: the fused tree in 128 x 256 tiles), 3 = tree_wgmma_kernel for the
// fused trees and leaf-parallel leaves of the training step's layouts and the (K, K) FP32 outputs, the
// rest as 1; 4 = as 3 with those products on the warp-specialised tree_wgmma_ws_kernel;
// 5 = as 4 with the ring's copies by TMA; 6 = as 5 with the fused BF16 trees in 128 x 256 tiles
// (tree_wgmma_wide_kernel); 7 = as 5 with the depth-2 fused BF16 trees' sibling leaves side by side (the default);
// 8 = as 5 with those trees' leaves rolled: each rounded under the next one's first MMAs.
extern int g_tree_form;
constexpr int TREE_GEMM_FORMS = 9;

// Whether tree_pipe_kernel can run this product with leaves [0, leaves) (layout, alignment, bounds).
bool tree_pipe_ok(const TreeArgs& g, int leaves);
// The fused tree of depth 0 .. 2 into g.c, the FP32-output GEMM (depth 0) into g.c, and the leaf-parallel
// form's leaves (one BF16 leaf per [M, N] slice of w), in the process's pipelined form; each needs
// tree_pipe_ok. They return the launch's cudaError_t.
int launch_pipe_fused(const TreeArgs& g, int depth, cudaStream_t st);
int launch_pipe_f32(const TreeArgs& g, cudaStream_t st);
int launch_pipe_leaves(const TreeArgs& g, int leaves, bf16* w, cudaStream_t st);
// Form 6's fused BF16 tree of depth 0 .. 2 in 128 x 256 tiles (gemm_wide.cu) for the layouts of
// tree_wgmma_ok: the launch's cudaError_t, or -1 (nothing launched) where the driver refuses a tensor map.
// C must not overlap A or B (a depth-2 tree's partial sums pass through C; the det_gemm launchers
// allocate C).
int launch_wide_fused(const TreeArgs& g, int depth, cudaStream_t st);
// Form 4's grid (rl_tree_wgmma_ws_persistent; forms 5 and 6 too): 1 one block per SM looping over tiles,
// 0 one block per tile. And the launches of form 6's kernel (rl_tree_form_launches).
extern int g_tws_persistent;
extern int64_t g_tww_launches;
// Launches of form 5's kernel (TMA copies; form 7's and 8's count too), of form 7's paired leaves and of
// form 8's rolled leaves (rl_tree_form_launches; defined in gemm_pipe.cu, counted by gemm_pipe_ws*.cu).
extern int64_t g_tws_tma_launches;
extern int64_t g_tws_pair_launches;
extern int64_t g_tws_roll_launches;
// Whether tree_wgmma_kernel / tree_wgmma_ws_kernel can run this product with leaves [0, leaves): the
// layouts (K, K), (K, MN), (MN, MN) of (A, B) and tree_pipe_ok's alignment and leaf bounds.
bool tree_wgmma_ok(const TreeArgs& g, int leaves);

// The families of gemm_pipe.cuh's kernels, one translation unit each (gemm_pipe.cu picks the family from
// the form; each returns the launch's cudaError_t). Layouts as tree_wgmma_ok admits them, read from the
// strides; hi / lo: B N-contiguous, A from s_ak. tree_pipe_kernel (gemm_pipe_tp.cu; `wide`: form 2's
// 128 x 256 geometry, else form 1's):
int tp_fused(const TreeArgs& g, int depth, bool wide, cudaStream_t st);
int tp_f32(const TreeArgs& g, cudaStream_t st);
int tp_leaves(const TreeArgs& g, int leaves, bf16* w, cudaStream_t st);
int tp_hilo(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, bool out_f32, cudaStream_t st);
// tree_wgmma_kernel (form 3; gemm_pipe_tw3.cu): the fused BF16 tree of depth 0 .. 2 (leaves 0), the FP32
// output (out_f32, depth 0) or the leaf-parallel leaves (leaves > 0, into g.c).
int tw3_tree(const TreeArgs& g, int depth, bool out_f32, int leaves, cudaStream_t st);
int tw3_hilo(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, bool out_f32, cudaStream_t st);
// tree_wgmma_ws_kernel (forms 4, 5, 7, 8): the fused BF16 trees (gemm_pipe_ws.cu), the FP32 output, the
// leaf-parallel leaves into g.c and hi / lo (gemm_pipe_ws_aux.cu).
int tws_fused(const TreeArgs& g, int depth, cudaStream_t st);
int tws_f32(const TreeArgs& g, cudaStream_t st);
int tws_leaves(const TreeArgs& g, int leaves, cudaStream_t st);
int tws_hilo(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, bool out_f32, cudaStream_t st);

}  // namespace rl
