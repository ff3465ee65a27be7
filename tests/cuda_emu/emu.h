// A host emulator for the cuda_bf16 kernels, used only by the tests on machines without a GPU.
//
// It runs the unchanged kernel code of rl_engine/backends/cuda_src/*.cu with g++: one user-space
// fiber (ucontext) per CUDA thread of a block, scheduled round-robin on the calling thread (blocks
// run one after another); __syncthreads / warp shuffles / __syncwarp are barriers of the scheduler
// (a barrier that can never complete, e.g. a non-uniform __syncthreads, aborts with a message);
// __shared__ variables are statics (safe because blocks run one at a time),
// dynamic shared memory as one buffer per launch, and a warp-collective WMMA emulation whose
// fragment layout is arbitrary but consistent (element e of lane l is matrix entry l * 8 + e).
// The build script (build.py) rewrites `kernel<<<cfg>>>(args)` into `emu_launch(kernel,
// emu_cfg(cfg), args)` and the dynamic shared-memory declaration into `emu_dynamic_smem()`.
//
// What it checks: index arithmetic, masks, strides, reduction orders, the K tree, the prototypes
// the Python side calls, batch invariance and prefill/decode equality of the real source. What it
// cannot check: tensor-core rounding inside one MMA (emulated as an FP32 FMA chain), timing,
// memory-model races beyond what the barriers enforce, and the device compiler itself.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __grid_constant__
#define __grid_constant__

struct EmuIdx {
    unsigned x, y, z;
};
extern EmuIdx emu_threadIdx;
extern EmuIdx emu_blockIdx;
extern EmuIdx emu_blockDim;
extern EmuIdx emu_gridDim;
#define threadIdx emu_threadIdx
#define blockIdx emu_blockIdx
#define blockDim emu_blockDim
#define gridDim emu_gridDim

void emu_sync_block();
void emu_sync_warp();
float* emu_warp_scratch();  // 3 * 256 floats per warp
unsigned char* emu_dynamic_smem();

inline void __syncthreads() { emu_sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_sync_warp(); }

inline float __shfl_xor_sync(unsigned, float v, int off) {
    float* buf = emu_warp_scratch();
    const unsigned lane = emu_threadIdx.x % 32;
    buf[lane] = v;
    emu_sync_warp();
    const float r = buf[lane ^ static_cast<unsigned>(off)];
    emu_sync_warp();
    return r;
}

// ldmatrix .x4 (common.cuh): every lane publishes its row address, then reads its four values.
inline const void** emu_warp_ptrs() {
    static const void* ptrs[64][32];
    return ptrs[emu_threadIdx.x / 32];
}
inline void ldsm_x4(uint32_t (&r)[4], const void* row) {
    const void** p = emu_warp_ptrs();
    const int lane = static_cast<int>(emu_threadIdx.x % 32);
    p[lane] = row;
    emu_sync_warp();
    const int g = lane >> 2, t = lane & 3;
    for (int q = 0; q < 4; ++q) std::memcpy(&r[q], static_cast<const unsigned char*>(p[8 * q + g]) + 4 * t, 4);
    emu_sync_warp();
}

// ldmatrix .x4 .trans (common.cuh): lane 4g + t reads element g of rows 2t and 2t + 1 of each matrix.
inline void ldsm_x4_t(uint32_t (&r)[4], const void* row) {
    const void** p = emu_warp_ptrs();
    const int lane = static_cast<int>(emu_threadIdx.x % 32);
    p[lane] = row;
    emu_sync_warp();
    const int g = lane >> 2, t = lane & 3;
    for (int q = 0; q < 4; ++q) {
        uint16_t lo, hi;
        std::memcpy(&lo, static_cast<const unsigned char*>(p[8 * q + 2 * t]) + 2 * g, 2);
        std::memcpy(&hi, static_cast<const unsigned char*>(p[8 * q + 2 * t + 1]) + 2 * g, 2);
        r[q] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
    emu_sync_warp();
}

// mma.sync m16n8k16 (common.cuh) with the PTX ISA's fragment layout, each output an FP32 FMA chain
// over k = 0 .. 15 in order (like the WMMA emulation below: what it checks is which products meet
// in which order, not the tensor core's rounding).
inline float emu_bf16_lo(uint32_t v) {
    const unsigned bits = (v & 0xffffu) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
inline float emu_bf16_hi(uint32_t v) {
    const unsigned bits = v & 0xffff0000u;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
inline void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    float* s = emu_warp_scratch();
    float* A = s;        // A[m][k], 16 x 16
    float* B = s + 256;  // B[k][n], 16 x 8
    float* C = s + 384;  // C[m][n], 16 x 8
    const int lane = static_cast<int>(emu_threadIdx.x % 32);
    const int g = lane >> 2, t = lane & 3;
    emu_sync_warp();  // the scratch may still be read by a previous collective
    A[g * 16 + 2 * t] = emu_bf16_lo(a[0]);
    A[g * 16 + 2 * t + 1] = emu_bf16_hi(a[0]);
    A[(g + 8) * 16 + 2 * t] = emu_bf16_lo(a[1]);
    A[(g + 8) * 16 + 2 * t + 1] = emu_bf16_hi(a[1]);
    A[g * 16 + 2 * t + 8] = emu_bf16_lo(a[2]);
    A[g * 16 + 2 * t + 9] = emu_bf16_hi(a[2]);
    A[(g + 8) * 16 + 2 * t + 8] = emu_bf16_lo(a[3]);
    A[(g + 8) * 16 + 2 * t + 9] = emu_bf16_hi(a[3]);
    B[(2 * t) * 8 + g] = emu_bf16_lo(b[0]);
    B[(2 * t + 1) * 8 + g] = emu_bf16_hi(b[0]);
    B[(2 * t + 8) * 8 + g] = emu_bf16_lo(b[1]);
    B[(2 * t + 9) * 8 + g] = emu_bf16_hi(b[1]);
    C[g * 8 + 2 * t] = d[0];
    C[g * 8 + 2 * t + 1] = d[1];
    C[(g + 8) * 8 + 2 * t] = d[2];
    C[(g + 8) * 8 + 2 * t + 1] = d[3];
    emu_sync_warp();
    const int rows[4] = {g, g, g + 8, g + 8};
    const int cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    float out[4];
    for (int e = 0; e < 4; ++e) {
        float acc = C[rows[e] * 8 + cols[e]];
        for (int k = 0; k < 16; ++k) acc = std::fma(A[rows[e] * 16 + k], B[k * 8 + cols[e]], acc);
        out[e] = acc;
    }
    emu_sync_warp();
    for (int e = 0; e < 4; ++e) d[e] = out[e];
}

// nvcc's cuda_runtime.h has this template for kernel pointers; the host-only header does not.
template <class R, class... P>
inline cudaError_t cudaFuncSetAttribute(R (*)(P...), enum cudaFuncAttribute, int) {
    return cudaSuccess;
}

inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }

// exp / log: the functions the Triton interpreter uses for tl.exp / tl.log and libdevice exp / log
// (rl_engine/ops/_interpreter.py, exp_fp32 / log_fp32), step for step in FP64 with basic IEEE
// operations only, then rounded once to FP32. The host's libm gives other bits in a few inputs (and
// different ones on different hosts), so with the same model on both sides a host test compares the
// Triton and the CUDA kernels' structure (which values meet, in which order) bit for bit. What the
// GPU computes (expf's libdevice sequence, tl.exp's ex2.approx.f32 of x * log2 e, logf) it cannot
// show: the same model stands for expf and for tl_exp here.
inline double emu_horner(double x, const double* c, int n) {
    double out = c[0];
    for (int i = 1; i < n; ++i) {
        const double prod = out * x;  // two roundings per step, never fused (-ffp-contract=off)
        out = prod + c[i];
    }
    return out;
}
inline float emu_exp_fp32(float xf) {
    if (std::isnan(xf)) return xf;
    if (xf == INFINITY) return INFINITY;
    if (xf == -INFINITY) return 0.0f;
    static const double* coeffs = [] {
        static double c[14];
        for (int n = 13; n >= 0; --n) {  // 1/n! for n = 13 .. 0, as the interpreter forms them
            double f = 1.0;
            for (int i = 1; i <= n; ++i) f *= i;
            c[13 - n] = 1.0 / f;
        }
        return c;
    }();
    const double x = std::fmin(std::fmax(static_cast<double>(xf), -200.0), 200.0);
    const double k = std::nearbyint(x * 1.4426950408889634);  // ties to even, as np.rint
    const double r = (x - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    return static_cast<float>(std::ldexp(emu_horner(r, coeffs, 14), static_cast<int>(k)));
}
inline float emu_log_fp32(float xf) {
    if (std::isnan(xf) || xf < 0.0f) return NAN;
    if (xf == 0.0f) return -INFINITY;
    if (xf == INFINITY) return INFINITY;
    static const double* coeffs = [] {
        static double c[12];
        for (int n = 11; n >= 0; --n) c[11 - n] = 2.0 / (2 * n + 1);  // 2/(2n+1) for n = 11 .. 0
        return c;
    }();
    int e = 0;
    double m = std::frexp(static_cast<double>(xf), &e);
    if (m < 0.7071067811865476) {
        m *= 2.0;
        e -= 1;
    }
    const double f = m - 1.0;
    const double s = f / (2.0 + f);
    const double log_m = s * emu_horner(s * s, coeffs, 12);
    const double ed = static_cast<double>(e);
    const double hi = ed * 0.6931471805599453;
    return static_cast<float>(hi + log_m);
}
#define expf emu_exp_fp32
#define logf emu_log_fp32
// Triton's tl.exp (common.cuh's tl_exp: ex2.approx.f32 of x * log2 e on the GPU), modelled as
// the interpreter models tl.exp.
inline float tl_exp(float x) { return emu_exp_fp32(x); }

template <class T>
inline T __ldg(const T* p) {
    return *p;
}

// cp.async (common.cuh): a synchronous copy of src_bytes bytes, the rest of the 16 zero-filled.
#define RL_HOST_EMU 1
inline void cp_async16(void* dst, const void* src, int src_bytes) {
    std::memcpy(dst, src, static_cast<size_t>(src_bytes));
    std::memset(static_cast<unsigned char*>(dst) + src_bytes, 0, static_cast<size_t>(16 - src_bytes));
}
inline void cp_async_commit() {}
// Shared-window addresses (common.cuh smem_u32 / cp_async16_s): here the byte offset into the launch's
// dynamic shared memory (every kernel that takes such addresses addresses only that), so address bits
// and the 128-byte swizzle behave as on the GPU, where dynamic shared memory starts 1024-byte aligned.
inline uint32_t smem_u32(const void* p) {
    return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - emu_dynamic_smem());
}
inline void cp_async16_s(uint32_t dst, const void* src, int src_bytes) { cp_async16(emu_dynamic_smem() + dst, src, src_bytes); }
inline void __trap() { std::abort(); }

// Warpgroup MMA (gemm_pipe.cu's wgmma_n128, attention_tc.cu's wgmma_ss_n64 / wgmma_rs_t; emu_wgmma
// below): operands in shared memory are read through their matrix descriptors, decoded here from the PTX ISA's canonical 128-byte
// swizzle layouts (as CUTLASS's make_gmma_desc writes them): K-major, element (row, k) at
// start + (row % 8) 128 + (row / 8) SBO + (k / 8) 16 + (k % 8) 2; MN-major (the transpose flag),
// element (mn, k) at start + (mn % 64) 2 + (mn / 64) LBO + (k % 8) 128 + (k / 8) SBO; then bits 4-6 of
// the address XORed with bits 7-9. The asynchronous issue, fences and waits need nothing here.
inline float emu_desc_elem(uint64_t desc, bool mn_major, int mn, int k) {
    if ((desc >> 62) != 1u) std::abort();  // only the 128-byte swizzle is emulated
    const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
    const uint32_t lbo = static_cast<uint32_t>((desc >> 16) & 0x3FFFu) << 4;
    const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4;
    uint32_t a = mn_major ? start + (mn % 64) * 2 + (mn / 64) * lbo + (k % 8) * 128 + (k / 8) * sbo
                          : start + (mn % 8) * 128 + (mn / 8) * sbo + (k / 8) * 16 + (k % 8) * 2;
    a ^= ((a >> 7) & 7u) << 4;
    uint16_t bits;
    std::memcpy(&bits, emu_dynamic_smem() + a, 2);
    return emu_bf16_lo(bits);
}
// One warpgroup MMA m64nNk16 as the emulation runs it: each thread's own N / 2 accumulator entries
// (warp w of the warpgroup: rows 16 w + g and + 8; column group j: columns 8 j + 2 t, + 1; d[4 j + e])
// as FP32 FMA chains over k = 0 .. 15 in order, from d (accumulate) or from +0 (scale-d 0); a_at(row, k)
// gives A, B is read through its descriptor (tb: MN-major).
template <int N, class AAt>
inline void emu_wgmma(float* d, AAt a_at, uint64_t db, bool tb, bool accumulate) {
    const int tid = static_cast<int>(emu_threadIdx.x);
    const int w = (tid >> 5) & 3, g = (tid & 31) >> 2, t = tid & 3;
    for (int j = 0; j < N / 8; ++j)
        for (int e = 0; e < 4; ++e) {
            const int row = 16 * w + g + 8 * (e >> 1);
            const int col = 8 * j + 2 * t + (e & 1);
            float acc = accumulate ? d[4 * j + e] : 0.0f;
            for (int k = 0; k < 16; ++k) acc = std::fma(a_at(row, k), emu_desc_elem(db, tb, col, k), acc);
            d[4 * j + e] = acc;
        }
}
template <int TA, int TB>
inline void wgmma_n128(float (&d)[64], uint64_t da, uint64_t db) {
    emu_wgmma<128>(d, [&](int row, int k) { return emu_desc_elem(da, TA != 0, row, k); }, db, TB != 0, true);
}
template <int TA, int TB>
inline void wgmma_n256(float (&d)[128], uint64_t da, uint64_t db) {
    emu_wgmma<256>(d, [&](int row, int k) { return emu_desc_elem(da, TA != 0, row, k); }, db, TB != 0, true);
}
// attention_tc.cu: S = Q K^T (both K-major, scale-d from `accumulate`) and P V with P in registers (the
// thread's m16n8k16 A fragment: a[0] row g, columns 2 t, + 1; a[1] row g + 8; a[2], a[3] columns + 8),
// exchanged through the warp's scratch; V MN-major.
inline void wgmma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
    emu_wgmma<64>(d, [&](int row, int k) { return emu_desc_elem(da, false, row, k); }, db, false, accumulate != 0);
}
template <int N>
inline void wgmma_rs_t(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db) {
    float* A = emu_warp_scratch();  // the warp's 16 rows x 16 k
    const int lane = static_cast<int>(emu_threadIdx.x % 32);
    const int g = lane >> 2, t = lane & 3;
    emu_sync_warp();  // the scratch may still be read by a previous collective
    for (int q = 0; q < 4; ++q) {
        const int r = g + 8 * (q & 1), c = 2 * t + 8 * (q >> 1);
        A[r * 16 + c] = emu_bf16_lo(a[q]);
        A[r * 16 + c + 1] = emu_bf16_hi(a[q]);
    }
    emu_sync_warp();
    emu_wgmma<N>(d, [&](int row, int k) { return A[(row % 16) * 16 + k]; }, db, true, true);
    emu_sync_warp();
}
inline float __int_as_float(int v) {
    float f;
    std::memcpy(&f, &v, 4);
    return f;
}
inline float __fdiv_rn(float a, float b) { return a / b; }
inline void wg_fence() {}
inline void wg_commit() {}
inline void wg_wait0() {}
inline void wg_wait1() {}
inline void fence_proxy_async() {}
inline void fence_mbar_init() {}
// Shared-memory barriers (gemm.cuh mbar_*): 8 bytes at the shared-window address, the arrival count of
// a phase and (pending arrivals | phase parity << 31). cp.async copies land at once here, so their
// arrival is an arrival; a wait yields to the other fibers until the phase of that parity has completed
// (and aborts after a number of rounds no correct protocol needs: a wait that can never end).
void emu_yield();
inline uint32_t* emu_mbar(uint32_t bar) { return reinterpret_cast<uint32_t*>(emu_dynamic_smem() + bar); }
// The transaction count of a phase (TMA bytes expected and not yet landed, mbarrier.expect_tx /
// complete_tx) is kept beside, per barrier address: a phase completes once its arrivals are spent and
// its transaction count is back at 0.
inline int64_t& emu_mbar_tx(uint32_t bar) {
    static std::vector<int64_t> tx;
    if (tx.size() <= bar / 8) tx.resize(bar / 8 + 1, 0);
    return tx[bar / 8];
}
inline void mbar_init(uint32_t bar, uint32_t count) {
    if ((bar & 7u) || count == 0 || count >= (1u << 31)) std::abort();
    emu_mbar(bar)[0] = count;
    emu_mbar(bar)[1] = count;
    emu_mbar_tx(bar) = 0;
}
inline void emu_mbar_settle(uint32_t bar) {  // complete the phase if both counts are spent
    uint32_t* m = emu_mbar(bar);
    if ((m[1] & 0x7fffffffu) == 0 && emu_mbar_tx(bar) == 0) m[1] = m[0] | (((m[1] >> 31) ^ 1u) << 31);
}
inline void mbar_arrive(uint32_t bar) {
    uint32_t* m = emu_mbar(bar);
    if ((m[1] & 0x7fffffffu) == 0) {
        std::fprintf(stderr, "cuda emulator: more arrivals on the barrier at %u than its count\n", bar);
        std::abort();
    }
    m[1] -= 1;
    emu_mbar_settle(bar);
}
inline void cp_async_mbar_arrive(uint32_t bar) { mbar_arrive(bar); }
inline void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    emu_mbar_tx(bar) += bytes;
    mbar_arrive(bar);
}
// TMA (gemm.cuh tma_map_bf16_2d / tma_load_2d): the map holds the tensor's geometry (emu.cpp writes it);
// a box copy lands at once, elements outside the tensor as zeros, each 16-byte chunk of a 128-byte row
// at the 128-byte swizzle's place (address bits 4-6 XOR bits 7-9, as emu_desc_elem reads them back), and
// completes its bytes on the barrier.
struct EmuTmaMap {
    const uint16_t* base;
    uint64_t inner, outer, stride_bytes;
    uint32_t box_inner, box_outer;
};
inline void tma_load_2d(uint32_t dst, const void* map, int32_t c0, int32_t c1, uint32_t bar) {
    EmuTmaMap m;
    std::memcpy(&m, map, sizeof m);
    if (m.base == nullptr || m.box_inner * 2 != 128 || (dst & 1023u) != 0 || c0 < 0 || c1 < 0) {
        std::fprintf(stderr, "cuda emulator: a TMA copy from an unset map, or to an unaligned place\n");
        std::abort();
    }
    for (uint32_t r = 0; r < m.box_outer; ++r)
        for (uint32_t e = 0; e < m.box_inner; ++e) {
            const uint64_t i = static_cast<uint64_t>(c0) + e, o = static_cast<uint64_t>(c1) + r;
            uint16_t v = 0;
            if (i < m.inner && o < m.outer) v = m.base[o * (m.stride_bytes / 2) + i];
            uint32_t a = dst + r * 128 + e * 2;
            a ^= ((a >> 7) & 7u) << 4;
            std::memcpy(emu_dynamic_smem() + a, &v, 2);
        }
    emu_mbar_tx(bar) -= static_cast<int64_t>(m.box_inner) * m.box_outer * 2;
    emu_mbar_settle(bar);
}
inline void mbar_wait(uint32_t bar, uint32_t parity) {
    for (long spins = 0; (emu_mbar(bar)[1] >> 31) == (parity & 1u); ++spins) {
        if (spins > 200000L) {  // (a correct wait here ends within a few thousand rounds)
            std::fprintf(stderr, "cuda emulator: a wait on the barrier at %u never completes\n", bar);
            std::abort();
        }
        emu_yield();
    }
}
template <int N>
inline void setmaxnreg_dec() {}
template <int N>
inline void setmaxnreg_inc() {}
// Programmatic dependent launch (common.cuh): launches run one after another here, so the wait has
// nothing to wait for and there is no early start to allow.
inline void pdl_wait() {}
inline void pdl_launch_dependents() {}
template <int N>
inline void cp_async_wait() {}

// ---------------------------------------------------------------------------------------------
// WMMA emulation (16 x 16 x 16, BF16 operands, FP32 accumulator).
// ---------------------------------------------------------------------------------------------
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    T x[8];
    enum { num_elements = 8 };
};

inline int emu_lane() { return static_cast<int>(emu_threadIdx.x % 32); }

template <class Use, class T, class Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
    const int lane = emu_lane();
    for (int e = 0; e < 8; ++e) {
        const int idx = lane * 8 + e;
        const int r = idx / 16, c = idx % 16;
        f.x[e] = std::is_same<Layout, row_major>::value ? p[r * ldm + c] : p[c * ldm + r];
    }
    emu_sync_warp();
}

template <class Use, class T, class Layout>
inline void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, T v) {
    for (int e = 0; e < 8; ++e) f.x[e] = v;
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f, unsigned ldm, layout_t l) {
    const int lane = emu_lane();
    for (int e = 0; e < 8; ++e) {
        const int idx = lane * 8 + e;
        const int r = idx / 16, c = idx % 16;
        if (l == mem_row_major) p[r * ldm + c] = f.x[e];
        else p[c * ldm + r] = f.x[e];
    }
    emu_sync_warp();
}

template <class LA, class LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
    float* s = emu_warp_scratch();
    float* A = s;          // A[m][k]
    float* B = s + 256;    // B[k][n]
    float* C = s + 512;    // C[m][n]
    const int lane = emu_lane();
    emu_sync_warp();  // the scratch may still be read by a previous collective
    for (int e = 0; e < 8; ++e) {
        const int idx = lane * 8 + e;
        A[idx] = __bfloat162float(a.x[e]);
        B[idx] = __bfloat162float(b.x[e]);
        C[idx] = c.x[e];
    }
    emu_sync_warp();
    float out[8];
    for (int e = 0; e < 8; ++e) {
        const int idx = lane * 8 + e;
        const int m = idx / 16, n = idx % 16;
        float acc = C[idx];
        for (int k = 0; k < 16; ++k) acc = std::fma(A[m * 16 + k], B[k * 16 + n], acc);
        out[e] = acc;
    }
    emu_sync_warp();
    for (int e = 0; e < 8; ++e) d.x[e] = out[e];
}
}  // namespace wmma
}  // namespace nvcuda

// ---------------------------------------------------------------------------------------------
// Launches
// ---------------------------------------------------------------------------------------------
struct EmuCfg {
    dim3 grid, block;
    size_t smem;
};
inline EmuCfg emu_cfg(dim3 g, dim3 b, size_t smem = 0, cudaStream_t = nullptr) { return EmuCfg{g, b, smem}; }

void emu_run_grid(const EmuCfg& cfg, const std::function<void()>& body);

template <class... P, class... A>
void emu_launch(void (*kernel)(P...), const EmuCfg& cfg, A&&... args) {
    std::tuple<P...> params(static_cast<P>(args)...);
    emu_run_grid(cfg, [&]() { std::apply(kernel, params); });
}
