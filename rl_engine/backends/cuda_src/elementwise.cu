// Elementwise ops of the cuda_bf16 backend: embedding (forward + deterministic backward), RoPE,
// SiLU, SwiGLU, pack / unpack. Every output element depends only on its own inputs (no reduction
// except the embedding backward, which sums a host-sorted segment in a fixed order), so batch
// invariance holds by construction.
#include <initializer_list>
#include <utility>

#include "common.cuh"

using namespace rl;

namespace {

constexpr int EW_THREADS = 256;
constexpr int EW_COLS = 1024;  // columns per block (grid.y covers the row)
constexpr int ROPE_HEADS = 4;  // heads per block of the RoPE kernel

// ---------------------------------------------------------------------------------------------
// SiLU / SwiGLU. Same operation order as the Triton kernels, FP32, one rounding.
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(EW_THREADS)
silu_fwd_kernel(const bf16* __restrict__ x, bf16* __restrict__ y, int64_t cols, int64_t sx, int64_t sy) {
    const int64_t row = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * EW_COLS;
    for (int i = threadIdx.x; i < EW_COLS; i += EW_THREADS) {
        const int64_t c = c0 + i;
        if (c >= cols) break;
        const float xv = f32(x[row * sx + c]);
        const float yv = xv / (1.0f + expf(-xv));
        y[row * sy + c] = to_bf16(yv);
    }
}

__global__ void __launch_bounds__(EW_THREADS)
silu_bwd_kernel(const bf16* __restrict__ x, const bf16* __restrict__ dy, bf16* __restrict__ dx, int64_t cols,
                int64_t sx, int64_t sdy, int64_t sdx) {
    const int64_t row = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * EW_COLS;
    for (int i = threadIdx.x; i < EW_COLS; i += EW_THREADS) {
        const int64_t c = c0 + i;
        if (c >= cols) break;
        const float xv = f32(x[row * sx + c]);
        const float g = f32(dy[row * sdy + c]);
        const float s = 1.0f / (1.0f + expf(-xv));
        const float d = g * s * (1.0f + xv * (1.0f - s));
        dx[row * sdx + c] = to_bf16(d);
    }
}

// Every load of a thread's EW_COLS / EW_THREADS columns is issued before the first product (a loop
// that loaded, computed and stored one column at a time waited for memory once per column: 3.1 us
// per launch at one decode row on the H200 against Triton's 1.7, evidence/2026-12-02-h200-decode-80982b6).
// Launched through launch_pdl (common.cuh's PDL rules: nothing is read before pdl_wait).
__global__ void __launch_bounds__(EW_THREADS)
swiglu_fwd_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up, bf16* __restrict__ y, int64_t cols,
                  int64_t sg, int64_t su, int64_t sy) {
    constexpr int PER_THREAD = EW_COLS / EW_THREADS;
    static_assert(EW_COLS % EW_THREADS == 0, "whole columns per thread");
    const int64_t row = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * EW_COLS + threadIdx.x;
    pdl_wait();
    pdl_launch_dependents();
    float g[PER_THREAD], u[PER_THREAD];
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int64_t c = c0 + static_cast<int64_t>(EW_THREADS) * j;
        g[j] = c < cols ? f32(gate[row * sg + c]) : 0.0f;
        u[j] = c < cols ? f32(up[row * su + c]) : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int64_t c = c0 + static_cast<int64_t>(EW_THREADS) * j;
        const float v = g[j] / (1.0f + expf(-g[j])) * u[j];
        if (c < cols) y[row * sy + c] = to_bf16(v);
    }
}

// The 16-byte form of the SwiGLU kernels (the host picks it where every row starts 16-byte aligned
// and the columns are a multiple of 8: Qwen3's packed gate / up halves): thread i of a block takes
// columns 8 i .. 8 i + 7 of the block's EW_VEC_COLS, one 16-byte load per operand and one 16-byte
// store per output, every load issued before the first product. The same FP32 expression per
// element as the 2-byte kernels below, so the same bits (an element's value does not depend on
// which thread computes it). The 2-byte backward moved 500 MB per Qwen3-8B layer at 4096 tokens in
// 0.22 ms (2.3 TB/s; the Triton kernel 2.9 TB/s; evidence/2026-12-06-h100-cuda-norm-fusions-af90ca4).
constexpr int EW_VEC = 8;
constexpr int EW_VEC_COLS = EW_THREADS * EW_VEC;

__device__ __forceinline__ void ld8_f32(const bf16* p, float (&v)[EW_VEC]) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const bf16* e = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
    for (int i = 0; i < EW_VEC; ++i) v[i] = f32(e[i]);
}

__device__ __forceinline__ void st8_bf16(bf16* p, const float (&v)[EW_VEC]) {
    uint4 raw;
    bf16* e = reinterpret_cast<bf16*>(&raw);
#pragma unroll
    for (int i = 0; i < EW_VEC; ++i) e[i] = to_bf16(v[i]);
    *reinterpret_cast<uint4*>(p) = raw;
}

// Launched through launch_pdl, as swiglu_fwd_kernel.
__global__ void __launch_bounds__(EW_THREADS)
swiglu_fwd_vec_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up, bf16* __restrict__ y, int64_t cols,
                      int64_t sg, int64_t su, int64_t sy) {
    const int64_t row = blockIdx.x;
    const int64_t c = static_cast<int64_t>(blockIdx.y) * EW_VEC_COLS + EW_VEC * static_cast<int64_t>(threadIdx.x);
    pdl_wait();
    pdl_launch_dependents();
    if (c >= cols) return;
    float g[EW_VEC], u[EW_VEC], v[EW_VEC];
    ld8_f32(gate + row * sg + c, g);
    ld8_f32(up + row * su + c, u);
#pragma unroll
    for (int i = 0; i < EW_VEC; ++i) v[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    st8_bf16(y + row * sy + c, v);
}

__global__ void __launch_bounds__(EW_THREADS)
swiglu_bwd_vec_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up, const bf16* __restrict__ dy,
                      bf16* __restrict__ dgate, bf16* __restrict__ dup, int64_t cols, int64_t sg, int64_t su,
                      int64_t sdy, int64_t sdg, int64_t sdu) {
    const int64_t row = blockIdx.x;
    const int64_t c = static_cast<int64_t>(blockIdx.y) * EW_VEC_COLS + EW_VEC * static_cast<int64_t>(threadIdx.x);
    if (c >= cols) return;
    float g[EW_VEC], u[EW_VEC], d[EW_VEC], dg[EW_VEC], du[EW_VEC];
    ld8_f32(gate + row * sg + c, g);
    ld8_f32(up + row * su + c, u);
    ld8_f32(dy + row * sdy + c, d);
#pragma unroll
    for (int i = 0; i < EW_VEC; ++i) {
        const float s = 1.0f / (1.0f + expf(-g[i]));
        dg[i] = d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
        du[i] = d[i] * g[i] * s;
    }
    st8_bf16(dgate + row * sdg + c, dg);
    st8_bf16(dup + row * sdu + c, du);
}

__global__ void __launch_bounds__(EW_THREADS)
swiglu_bwd_kernel(const bf16* __restrict__ gate, const bf16* __restrict__ up, const bf16* __restrict__ dy,
                  bf16* __restrict__ dgate, bf16* __restrict__ dup, int64_t cols, int64_t sg, int64_t su,
                  int64_t sdy, int64_t sdg, int64_t sdu) {
    const int64_t row = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * EW_COLS;
    for (int i = threadIdx.x; i < EW_COLS; i += EW_THREADS) {
        const int64_t c = c0 + i;
        if (c >= cols) break;
        const float g = f32(gate[row * sg + c]);
        const float u = f32(up[row * su + c]);
        const float d = f32(dy[row * sdy + c]);
        const float s = 1.0f / (1.0f + expf(-g));
        const float dg = d * u * s * (1.0f + g * (1.0f - s));
        const float du = d * g * s;
        dgate[row * sdg + c] = to_bf16(dg);
        dup[row * sdu + c] = to_bf16(du);
    }
}

// ---------------------------------------------------------------------------------------------
// RoPE, rotate-half (Hugging Face Qwen3): out = [x1*cos - x2*sin, x2*cos + x1*sin], FP32, one
// rounding. The backward is the same rotation with -sin (negation is exact).
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(EW_THREADS)
rope_kernel(const bf16* __restrict__ x, const float* __restrict__ cosv, const float* __restrict__ sinv,
            bf16* __restrict__ y, int64_t heads, int64_t half, int64_t sxt, int64_t sxh, int64_t sct,
            int64_t sst, int64_t syt, int64_t syh, int neg_sin) {
    const int64_t t = blockIdx.x;
    const int64_t h0 = static_cast<int64_t>(blockIdx.y) * ROPE_HEADS;
    const int64_t nh = (heads - h0) < ROPE_HEADS ? (heads - h0) : ROPE_HEADS;
    const int64_t work = nh * half;
    for (int64_t e = threadIdx.x; e < work; e += EW_THREADS) {
        const int64_t h = h0 + e / half;
        const int64_t i = e % half;
        const float c = cosv[t * sct + i];
        float s = sinv[t * sst + i];
        if (neg_sin) s = -s;
        const bf16* xr = x + t * sxt + h * sxh;
        bf16* yr = y + t * syt + h * syh;
        const float x1 = f32(xr[i]);
        const float x2 = f32(xr[i + half]);
        const float y1 = x1 * c - x2 * s;
        const float y2 = x2 * c + x1 * s;
        yr[i] = to_bf16(y1);
        yr[i + half] = to_bf16(y2);
    }
}

// ---------------------------------------------------------------------------------------------
// Embedding. Forward copies BF16 bits. Backward: the host sorts the ids stably, so the tokens of
// one id form a contiguous segment in token order; one block per (segment, column block) adds
// that segment's upstream rows in FP32 in that order and writes the id's row once.
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(EW_THREADS)
embedding_fwd_kernel(const int64_t* __restrict__ ids, const bf16* __restrict__ w, bf16* __restrict__ out,
                     int64_t cols, int64_t sid, int64_t sw, int64_t so) {
    const int64_t row = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * EW_COLS;
    const int64_t idx = ids[row * sid];
    for (int i = threadIdx.x; i < EW_COLS; i += EW_THREADS) {
        const int64_t c = c0 + i;
        if (c >= cols) break;
        put_bits(out + row * so + c, bits(w + idx * sw + c));
    }
}

__global__ void __launch_bounds__(EW_THREADS)
embedding_bwd_kernel(const int64_t* __restrict__ seg_ids, const int64_t* __restrict__ seg_start,
                     const int64_t* __restrict__ seg_end, const int64_t* __restrict__ order,
                     const bf16* __restrict__ dy, bf16* __restrict__ dw, int64_t cols, int64_t sdy, int64_t sdw) {
    const int64_t seg = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * EW_COLS;
    const int64_t idx = seg_ids[seg];
    const int64_t start = seg_start[seg];
    const int64_t end = seg_end[seg];
    for (int i = threadIdx.x; i < EW_COLS; i += EW_THREADS) {
        const int64_t c = c0 + i;
        if (c >= cols) break;
        float acc = 0.0f;
        for (int64_t j = start; j < end; ++j) acc += f32(dy[order[j] * sdy + c]);
        dw[idx * sdw + c] = to_bf16(acc);
    }
}

// ---------------------------------------------------------------------------------------------
// pack: padded [B, S, E] -> packed [T, E]; unpack: packed -> padded with exact zeros in the
// padding. Bits are copied unchanged.
// ---------------------------------------------------------------------------------------------
__global__ void __launch_bounds__(EW_THREADS)
pack_kernel(const bf16* __restrict__ x, const int32_t* __restrict__ cu, const int32_t* __restrict__ seq_of_row,
            bf16* __restrict__ y, int64_t cols, int64_t sxb, int64_t sxs, int64_t sy) {
    const int64_t t = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * EW_COLS;
    const int64_t b = seq_of_row[t];
    const int64_t s = t - static_cast<int64_t>(cu[b]);
    for (int i = threadIdx.x; i < EW_COLS; i += EW_THREADS) {
        const int64_t c = c0 + i;
        if (c >= cols) break;
        put_bits(y + t * sy + c, bits(x + b * sxb + s * sxs + c));
    }
}

__global__ void __launch_bounds__(EW_THREADS)
unpack_kernel(const bf16* __restrict__ x, const int32_t* __restrict__ cu, bf16* __restrict__ y, int64_t cols,
              int64_t seq_len, int64_t sx, int64_t syb, int64_t sys) {
    const int64_t r = blockIdx.x;
    const int64_t c0 = static_cast<int64_t>(blockIdx.y) * EW_COLS;
    const int64_t b = r / seq_len;
    const int64_t s = r % seq_len;
    const int64_t start = cu[b];
    const int64_t len = static_cast<int64_t>(cu[b + 1]) - start;
    for (int i = threadIdx.x; i < EW_COLS; i += EW_THREADS) {
        const int64_t c = c0 + i;
        if (c >= cols) break;
        const unsigned short v = (s < len) ? bits(x + (start + s) * sx + c) : static_cast<unsigned short>(0);
        put_bits(y + b * syb + s * sys + c, v);
    }
}

inline dim3 row_grid(int64_t rows, int64_t cols) {
    return dim3(static_cast<unsigned>(rows), static_cast<unsigned>(cdiv(cols, EW_COLS)));
}

inline bool grid_ok(int64_t rows, int64_t cols) {
    return rows > 0 && cols > 0 && rows < 2147483647LL && cdiv(cols, EW_COLS) <= 65535;
}

// Whether the 16-byte SwiGLU kernels can run: columns a multiple of 8, every row of every operand
// 16-byte aligned (base and row stride).
inline bool vec_rows_ok(int64_t cols, std::initializer_list<std::pair<const void*, int64_t>> operands) {
    if (cols % EW_VEC) return false;
    for (const auto& [p, stride] : operands)
        if ((reinterpret_cast<uintptr_t>(p) & 15u) || (stride % EW_VEC)) return false;
    return true;
}

inline dim3 vec_grid(int64_t rows, int64_t cols) {
    return dim3(static_cast<unsigned>(rows), static_cast<unsigned>(cdiv(cols, EW_VEC_COLS)));
}

}  // namespace

RL_EXPORT int rl_silu_fwd(const void* x, void* y, int64_t rows, int64_t cols, int64_t sx, int64_t sy, void* stream) {
    if (rows == 0 || cols == 0) return 0;
    if (!grid_ok(rows, cols)) return static_cast<int>(cudaErrorInvalidValue);
    silu_fwd_kernel<<<row_grid(rows, cols), EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(x), static_cast<bf16*>(y), cols, sx, sy);
    return launch_status();
}

RL_EXPORT int rl_silu_bwd(const void* x, const void* dy, void* dx, int64_t rows, int64_t cols, int64_t sx, int64_t sdy, int64_t sdx, void* stream) {
    if (rows == 0 || cols == 0) return 0;
    if (!grid_ok(rows, cols)) return static_cast<int>(cudaErrorInvalidValue);
    silu_bwd_kernel<<<row_grid(rows, cols), EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(x), static_cast<const bf16*>(dy), static_cast<bf16*>(dx), cols, sx, sdy, sdx);
    return launch_status();
}

RL_EXPORT int rl_swiglu_fwd(const void* gate, const void* up, void* y, int64_t rows, int64_t cols, int64_t sg, int64_t su, int64_t sy, void* stream) {
    if (rows == 0 || cols == 0) return 0;
    if (!grid_ok(rows, cols)) return static_cast<int>(cudaErrorInvalidValue);
    if (vec_rows_ok(cols, {{gate, sg}, {up, su}, {y, sy}}))
        return launch_pdl(swiglu_fwd_vec_kernel, vec_grid(rows, cols), dim3(EW_THREADS), 0,
                          static_cast<cudaStream_t>(stream), static_cast<const bf16*>(gate), static_cast<const bf16*>(up),
                          static_cast<bf16*>(y), cols, sg, su, sy);
    return launch_pdl(swiglu_fwd_kernel, row_grid(rows, cols), dim3(EW_THREADS), 0, static_cast<cudaStream_t>(stream),
                      static_cast<const bf16*>(gate), static_cast<const bf16*>(up), static_cast<bf16*>(y), cols, sg, su,
                      sy);
}

RL_EXPORT int rl_swiglu_bwd(const void* gate, const void* up, const void* dy, void* dgate, void* dup, int64_t rows, int64_t cols, int64_t sg, int64_t su, int64_t sdy, int64_t sdg, int64_t sdu, void* stream) {
    if (rows == 0 || cols == 0) return 0;
    if (!grid_ok(rows, cols)) return static_cast<int>(cudaErrorInvalidValue);
    if (vec_rows_ok(cols, {{gate, sg}, {up, su}, {dy, sdy}, {dgate, sdg}, {dup, sdu}})) {
        swiglu_bwd_vec_kernel<<<vec_grid(rows, cols), EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
            static_cast<const bf16*>(gate), static_cast<const bf16*>(up), static_cast<const bf16*>(dy),
            static_cast<bf16*>(dgate), static_cast<bf16*>(dup), cols, sg, su, sdy, sdg, sdu);
        return launch_status();
    }
    swiglu_bwd_kernel<<<row_grid(rows, cols), EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(gate), static_cast<const bf16*>(up), static_cast<const bf16*>(dy),
        static_cast<bf16*>(dgate), static_cast<bf16*>(dup), cols, sg, su, sdy, sdg, sdu);
    return launch_status();
}

RL_EXPORT int rl_rope(const void* x, const void* cosv, const void* sinv, void* y, int64_t tokens, int64_t heads, int64_t head_dim, int64_t sxt, int64_t sxh, int64_t sct, int64_t sst, int64_t syt, int64_t syh, int64_t neg_sin, void* stream) {
    if (tokens == 0 || heads == 0 || head_dim == 0) return 0;
    if ((head_dim & 1) || tokens >= 2147483647LL || cdiv(heads, ROPE_HEADS) > 65535)
        return static_cast<int>(cudaErrorInvalidValue);
    dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(cdiv(heads, ROPE_HEADS)));
    rope_kernel<<<grid, EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(x), static_cast<const float*>(cosv), static_cast<const float*>(sinv),
        static_cast<bf16*>(y), heads, head_dim / 2, sxt, sxh, sct, sst, syt, syh, neg_sin ? 1 : 0);
    return launch_status();
}

RL_EXPORT int rl_embedding_fwd(const void* ids, const void* weight, void* out, int64_t tokens, int64_t cols, int64_t sid, int64_t sw, int64_t so, void* stream) {
    if (tokens == 0 || cols == 0) return 0;
    if (!grid_ok(tokens, cols)) return static_cast<int>(cudaErrorInvalidValue);
    embedding_fwd_kernel<<<row_grid(tokens, cols), EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const int64_t*>(ids), static_cast<const bf16*>(weight), static_cast<bf16*>(out), cols, sid, sw, so);
    return launch_status();
}

RL_EXPORT int rl_embedding_bwd(const void* seg_ids, const void* seg_start, const void* seg_end, const void* order, const void* dy, void* dw, int64_t n_segments, int64_t cols, int64_t sdy, int64_t sdw, void* stream) {
    if (n_segments == 0 || cols == 0) return 0;
    if (!grid_ok(n_segments, cols)) return static_cast<int>(cudaErrorInvalidValue);
    embedding_bwd_kernel<<<row_grid(n_segments, cols), EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const int64_t*>(seg_ids), static_cast<const int64_t*>(seg_start),
        static_cast<const int64_t*>(seg_end), static_cast<const int64_t*>(order), static_cast<const bf16*>(dy),
        static_cast<bf16*>(dw), cols, sdy, sdw);
    return launch_status();
}

RL_EXPORT int rl_pack(const void* x, const void* cu, const void* seq_of_row, void* y, int64_t total, int64_t cols, int64_t sxb, int64_t sxs, int64_t sy, void* stream) {
    if (total == 0 || cols == 0) return 0;
    if (!grid_ok(total, cols)) return static_cast<int>(cudaErrorInvalidValue);
    pack_kernel<<<row_grid(total, cols), EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(x), static_cast<const int32_t*>(cu), static_cast<const int32_t*>(seq_of_row),
        static_cast<bf16*>(y), cols, sxb, sxs, sy);
    return launch_status();
}

RL_EXPORT int rl_unpack(const void* x, const void* cu, void* y, int64_t n_seqs, int64_t seq_len, int64_t cols, int64_t sx, int64_t syb, int64_t sys, void* stream) {
    if (n_seqs == 0 || seq_len == 0 || cols == 0) return 0;
    if (!grid_ok(n_seqs * seq_len, cols)) return static_cast<int>(cudaErrorInvalidValue);
    unpack_kernel<<<row_grid(n_seqs * seq_len, cols), EW_THREADS, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const bf16*>(x), static_cast<const int32_t*>(cu), static_cast<bf16*>(y), cols, seq_len, sx, syb, sys);
    return launch_status();
}
