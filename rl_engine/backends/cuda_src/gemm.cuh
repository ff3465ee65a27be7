// Shared by the GEMM sources of the cuda_bf16 backend (gemm.cu, gemm_pipe.cu): the tree GEMM's
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
#endif

// The training-size GEMM form of the process (rl_tree_gemm_form; gemm_pipe.cu): 0 = the WMMA kernels,
// 1 and 2 = tree_pipe_kernel (2: the fused tree in 128 x 256 tiles), 3 = tree_wgmma_kernel for the
// fused trees of the training step's layouts and the (K, K) FP32 outputs, the rest as 1 (the default).
extern int g_tree_form;
constexpr int TREE_GEMM_FORMS = 4;

// Whether tree_pipe_kernel can run this product with leaves [0, leaves) (layout, alignment, bounds).
bool tree_pipe_ok(const TreeArgs& g, int leaves);
// The fused tree of depth 0 .. 2 into g.c, the FP32-output GEMM (depth 0) into g.c, and the leaf-parallel
// form's leaves (one BF16 leaf per [M, N] slice of w), in the process's pipelined form; each needs
// tree_pipe_ok. They return the launch's cudaError_t.
int launch_pipe_fused(const TreeArgs& g, int depth, cudaStream_t st);
int launch_pipe_f32(const TreeArgs& g, cudaStream_t st);
int launch_pipe_leaves(const TreeArgs& g, int leaves, bf16* w, cudaStream_t st);

}  // namespace rl
