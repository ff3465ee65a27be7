// Shared pieces of the cuda_bf16 backend. Framework-free: CUDA runtime + cuda_bf16.h only.
//
// Conventions of every file in this folder
// -----------------------------------------
// * Host entry points are `RL_EXPORT int rl_<name>(...)`: raw device pointers (`const void*` /
//   `void*`), sizes and strides in elements as `int64_t`, scalars as `float`, and the stream as the
//   last argument (`void*`, a `cudaStream_t`). They return the `cudaError_t` of the launch (0 on
//   success); the Python side turns a non-zero value into an exception with
//   `rl_cuda_error_string`. The Python loader parses these prototypes (one per line, in the form
//   `RL_EXPORT int rl_name(type name, ...)`) to set the ctypes argument types, so keep them on one
//   line each.
// * BF16 in, BF16 out (FP32 where the op says so), FP32 math, one rounding at the end
//   (`__float2bfloat16_rn`, round to nearest even, the same as PyTorch's cast).
// * No atomics. Every reduction has a fixed order that depends only on the length of the reduced
//   axis, never on the number of rows, the batch or the strides. Launch configurations (threads,
//   tiles) are compile-time constants.
// * The library is built with `-fmad=false`: the compiler never contracts a*b+c into an FMA on its
//   own, so the same source expression rounds the same way in every kernel and template instance
//   (this is what makes attention prefill and decode bitwise equal). Where an FMA is wanted it is
//   written as `__fmaf_rn`. IEEE division and square root (no --use_fast_math).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define RL_EXPORT extern "C" __attribute__((visibility("default")))

namespace rl {

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float f32(float v) { return v; }
__device__ __forceinline__ bf16 to_bf16(float v) { return __float2bfloat16_rn(v); }

// Typed store of an FP32 value: rounds once for BF16, stores as is for FP32.
__device__ __forceinline__ void store_as(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store_as(float* p, float v) { *p = v; }

// Raw 16-bit copies (no conversion: embedding / pack move BF16 bits unchanged).
__device__ __forceinline__ unsigned short bits(const bf16* p) {
    return *reinterpret_cast<const unsigned short*>(p);
}
__device__ __forceinline__ void put_bits(bf16* p, unsigned short v) {
    *reinterpret_cast<unsigned short*>(p) = v;
}

// Asynchronous 16-byte global -> shared copies (sm_80+ cp.async): src_bytes (0..16) bytes are read
// and the rest of the 16 zero-filled; cp_async_wait<N> waits until at most N committed groups are
// still in flight. The host emulator (tests/cuda_emu/emu.h) defines RL_HOST_EMU and its own
// synchronous versions (the copy lands at once, so every wait is already satisfied).
// smem_u32: the shared-window address of a shared-memory pointer; cp_async16_s takes one (a kernel
// that works its copy destinations out once per block keeps them as such addresses).
#ifndef RL_HOST_EMU
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    cp_async16_s(smem_u32(dst), src, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif

// One BF16 tensor-core MMA, D[16 x 8] += A[16 x 16] @ B[16 x 8] with FP32 accumulation
// (mma.sync m16n8k16 row.col, the HMMA instruction that WMMA's 16x16x16 BF16 tiles are made of).
// Fragments in the PTX ISA's layout, lane = 4 g + t: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
// a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]; b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
// d[0..1] = D[g][2t, 2t+1], d[2..3] = D[g+8][2t, 2t+1] (the lower-indexed element in the low half).
// Also ldmatrix. The host emulator defines its own versions (tests/cuda_emu/emu.h).
#ifndef RL_HOST_EMU
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// ldmatrix .x4 (four 8 x 8 BF16 matrices from shared memory; lanes 8q .. 8q + 7 give the row
// addresses of matrix q, 16 bytes each): r[q] of lane 4g + t = matrix q, row g, elements 2t, 2t + 1.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* row) {
    const unsigned a = smem_u32(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");  // reads shared memory that plain stores and cp.async wrote: keep it in order
}
// ldmatrix .x4 .trans: the same four 8 x 8 matrices, each transposed on the way: r[q] of lane 4g + t
// = matrix q, rows 2t and 2t + 1 (low half: row 2t), element g. From a [k][m] layout this gives
// the fragments ldsm_x4 gives from [m][k].
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* row) {
    const unsigned a = smem_u32(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}
#endif

// Programmatic dependent launch (PDL, sm_90; CUDA Programming Guide, "Programmatic Dependent
// Launch and Synchronization"). A kernel launched by launch_pdl with PDL on may start while the
// kernel before it in the stream still runs. Rules every such kernel keeps:
//   * Every block calls pdl_wait() (griddepcontrol.wait), before its first read of anything the
//     kernel before it may write, before its first global write and before any early return; it
//     returns once that kernel has completed and its writes are visible. Before it, a block only
//     reads what no kernel writes while it runs (weights, and only where the caller said so: PDL
//     mode 2 below) and writes its own shared memory. (Every block waits, so the kernel cannot
//     complete before the one before it.)
//   * pdl_launch_dependents() (griddepcontrol.launch_dependents) comes after pdl_wait(), so the
//     next kernel can start only once every kernel before this one has completed: at any moment
//     at most two kernels of a stream overlap, and a kernel's wait covers every earlier kernel.
// Launched without PDL (PDL off, or a triple-chevron launch), both instructions return at once.
// The emulator (tests/cuda_emu/emu.h) defines them as no-ops: its launches run one after another.
#ifndef RL_HOST_EMU
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
#endif

__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}
__device__ __forceinline__ bool aligned4(const void* p) {
    return (reinterpret_cast<uintptr_t>(p) & 3u) == 0;
}

// Sum of one value per lane over a full warp with a fixed xor butterfly. Every lane ends with the
// same bits (each step adds the same two operands, and FP32 addition is commutative).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// The same butterfly over aligned groups of 16 lanes (half warps).
__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

// Triton's tl.exp for FP32 on sm_90, instruction for instruction (its PTX: mul.f32 by 0f3FB8AA3B,
// then ex2.approx.f32, no flush to zero): where a kernel must give the Triton backend's bits, it
// calls this instead of expf (a different function: they differ in about 30 % of inputs on the
// H200, docs/declared-arithmetic.md). The host emulator supplies its own (tests/cuda_emu/emu.h).
#ifndef RL_HOST_EMU
__device__ __forceinline__ float tl_exp(float x) {
    float y;
    asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, 1.44269502162933349609375f)));
    return y;
}
#endif

// Combine two (running max, running sum of exp(z - max)) pairs of an online log-sum-exp.
// Symmetric in its two arguments (bitwise), so a butterfly leaves every lane with the same bits.
// A pair that is still (-inf, 0) contributes exactly 0; +inf maxima give NaN, as log_softmax does.
__device__ __forceinline__ void lse_combine(float& m, float& s, float m2, float s2) {
    const float mn = fmaxf(m, m2);
    const float ref = (mn == -INFINITY) ? 0.0f : mn;
    s = s * expf(m - ref) + s2 * expf(m2 - ref);
    m = mn;
}

__host__ __device__ __forceinline__ int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The status of the launches just issued (0 = cudaSuccess).
inline int launch_status() { return static_cast<int>(cudaGetLastError()); }

// PDL mode (rl_set_programmatic_launch, runtime.cu): 0 = launch_pdl makes a plain triple-chevron
// launch; 1 = with the programmatic-stream-serialization attribute; 2 = that, and kernels that
// stream a weight (the warp GEMV's B operand, add + RMSNorm's weight) start copying it before
// pdl_wait. Mode 2 is the caller's promise that the kernel before such a launch does not write
// those operands (a decode step: none of its kernels writes a weight).
extern int g_programmatic_launch;
inline bool pdl_early_weights() { return g_programmatic_launch >= 2; }

// Launch `kernel` on `st`, with PDL when it is on and `allow` holds (a launcher's own speed rule).
// Only kernels that keep common.cuh's PDL rules (pdl_wait before dependent reads and global writes)
// may be launched this way.
template <class... P, class... A>
inline int launch_pdl_if(bool allow, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                         A... args) {
#ifndef RL_HOST_EMU
    if (g_programmatic_launch && allow) {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = st;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        return static_cast<int>(cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...));
    }
#endif
    kernel<<<grid, block, smem, st>>>(static_cast<P>(args)...);
    return launch_status();
}

template <class... P, class... A>
inline int launch_pdl(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, A... args) {
    return launch_pdl_if(true, kernel, grid, block, smem, st, args...);
}

}  // namespace rl
