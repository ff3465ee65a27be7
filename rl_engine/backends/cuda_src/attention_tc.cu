// The declared form (on tensor cores) of the cuda_bf16 attention forward and decode step (rl_attention_fwd_form 1;
// head dims 64 and 128, other head dims run attention.cu's form): the Triton backend's kernels
// (rl_engine/ops/attention/triton.py, _attn_fwd_kernel and _attn_decode_kernel with ROW_SUM_PINNED)
// written out in CUDA with the instructions Triton 3.6 compiles them to on sm_90 (read from its PTX,
// tools/attention_ptx_order.py), so that the two backends can give the same bits
// (docs/declared-arithmetic.md, "Attention"):
//   * one warpgroup (128 threads) per tile of 64 query rows (prefill: rows of one head; decode: the
//     query heads of one KV group, padded to 64 rows as the Triton decode pads them), KV blocks of
//     64 keys [0, 64), [64, 128), ... of the sequence in increasing order;
//   * S = Q K^T: wgmma m64n64k16, both operands from shared memory (128-byte swizzle, K-major), D / 16
//     products in increasing d, the first with scale-d 0 (no accumulator input), FP32;
//   * s = S * scale; in a block every real row sees whole, a score of -inf becomes NaN; in the others
//     a key past the row's causal limit gets -inf and a visible -inf becomes NaN (0x7FC00000);
//   * m_new = max(m, row max) (max.f32); ref = m_new == -inf ? 0 : m_new; alpha = m_new == m ? 1 :
//     tl_exp(m - ref); p = tl_exp(s - ref) (common.cuh: ex2.approx.f32 of x * log2 e, Triton's tl.exp);
//   * l = l * alpha + rowsum(p) (a multiply, then an add), the row sum in fragment_row_sum's order:
//     each thread adds its 16 values of the row over the key index's bits 0, 3, 4, 5 (a pairwise tree
//     in fragment order), then the quad butterfly over bit 2 (lane xor 2), then bit 1 (lane xor 1);
//   * acc = acc * alpha, then acc += bf16(P) V: wgmma m64nDk16 with P from registers (the S
//     accumulator's fragment is the A operand's) and V from shared memory (MN-major, the transpose
//     flag), 4 products in increasing key;
//   * "masked means absent" in the blocks that hold masked entries, as _absent_mma: V's non-finite
//     values are made 0 for the product, and an output element that a kept non-finite value reaches is
//     NaN (Triton counts them with a second MMA; here the first such key of each column is found in
//     shared memory and compared with the row's limit: the same predicate, exact);
//   * out = div_rn(acc, l != 0 ? l : 1) rounded once to BF16 (l = 0: no visible key, exact 0);
//     lse = l != 0 ? m + logf(l) : 0 (libdevice logf, as Triton's tl.log).
// A tile's rows are independent (per-row softmax state; each wgmma output element depends only on
// its own row and column), so a query's bits are the same in a full prefill, a chunk and a decode
// step, whatever the other rows of its tile (the Triton backend's argument, module docs of triton.py).
// Pipeline: Q and two KV stages in shared memory (cp.async; 16-byte copies when every row starts on
// a 16-byte boundary, else 2-byte stores: the same bytes land in the same places).
// The host emulation (tests/cuda_emu/emu.h) runs the MMAs as FP32 FMA chains in increasing k, the
// Triton interpreter's model of tl.dot, and tl_exp as the interpreter's exp: on a CPU the two
// backends' sequences are compared; the GPU compares the instructions.
#include "attention.cuh"
#include "gemm.cuh"

using namespace rl;
using namespace rl::attn;

namespace {

constexpr int TF_THREADS = 128;  // one warpgroup
constexpr int TF_ROWS = 64;      // query rows per tile = keys per KV block
static_assert(TF_ROWS == AT_BKV, "the tile's key block is the forward's KV block");

template <int D>
struct TfShape {
    static_assert(D == 64 || D == 128, "the declared forward is written for head dims 64 and 128");
    static constexpr int CHUNKS = D / 8;                          // 16-byte chunks per row
    static constexpr uint32_t TILE = TF_ROWS * D * 2;             // bytes of a 64-row tile
    static constexpr int COPIES = TF_ROWS * CHUNKS / TF_THREADS;  // 16-byte copies per thread per tile
    // Q, then stage s: K at 1 + 2 s, V at 2 + 2 s; then the first non-finite key of each V column.
    static constexpr size_t SMEM = 5 * static_cast<size_t>(TILE) + D * sizeof(int);
};

// Byte offset of chunk c (elements 8 c .. 8 c + 7) of row r in a tile: 64-element swizzle atoms along
// D (8 KB each: 64 rows of 128 bytes), inside an atom chunk (c % 8) ^ (r % 8) of row r. The K-major
// layout of Q and K and the MN-major layout of V (stride byte offset 1024 between groups of 8 key rows,
// leading byte offset 8192 between atoms) put the same element at the same place.
__device__ __forceinline__ uint32_t tf_off(int r, int c) {
    return static_cast<uint32_t>((c >> 3) * 8192 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Rows [0, 64) of a tile from base + r * stride (unit stride along D), zero rows from `valid` on.
template <int D>
__device__ __forceinline__ void tf_load(unsigned char* smem, uint32_t tile, const bf16* base, int64_t stride,
                                        int64_t valid, bool vec) {
    using S = TfShape<D>;
    const int tid = threadIdx.x;
    if (vec) {
#pragma unroll
        for (int i = 0; i < S::COPIES; ++i) {
            const int e = tid + TF_THREADS * i;
            const int r = e / S::CHUNKS;
            const int c = e % S::CHUNKS;
            const bool ok = r < valid;
            cp_async16_s(smem_u32(smem) + tile + tf_off(r, c), ok ? base + r * stride + 8 * c : base, ok ? 16 : 0);
        }
        return;
    }
    for (int e = tid; e < TF_ROWS * D; e += TF_THREADS) {
        const int r = e / D;
        const int d = e % D;
        const bf16 v = r < valid ? base[r * stride + d] : to_bf16(0.0f);
        *reinterpret_cast<bf16*>(smem + tile + tf_off(r, d >> 3) + 2 * (d & 7)) = v;
    }
}

#ifndef RL_HOST_EMU  // (the host emulator, tests/cuda_emu/emu.h, has its own)
// d[N / 2] += A (64 x 16 BF16 in registers: the m16n8k16 A fragment of the thread's warp, rows 16 w ..
// 16 w + 15) @ B (16 x N, MN-major descriptor db: the transpose flag). N = 64 or 128.
template <int N>
__device__ __forceinline__ void wgmma_rs_t(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db);

template <>
__device__ __forceinline__ void wgmma_rs_t<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %37, 0;\n"  // scale-d: accumulate into d
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

template <>
__device__ __forceinline__ void wgmma_rs_t<128>(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %69, 0;\n"  // scale-d: accumulate into d
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
#endif

// Triton's NaN constant (float("nan") in the kernel: 0x7FC00000).
__device__ __forceinline__ float tf_nan() { return __int_as_float(0x7FC00000); }

__device__ __forceinline__ uint32_t tf_pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // cvt.rn.bf16x2.f32: .x (lo) in the low half
    return *reinterpret_cast<const uint32_t*>(&v);
}

// This thread's place in the warpgroup's accumulator fragments: warp w holds rows 16 w .. 16 w + 15 of
// the 64-row tile, lane 4 g + t rows 16 w + g (hh = 0) and + 8 (hh = 1), columns 8 j + 2 t, + 1.
struct TfLane {
    int warp, g, t;
    __device__ __forceinline__ TfLane()
        : warp(static_cast<int>(threadIdx.x) >> 5), g((static_cast<int>(threadIdx.x) & 31) >> 2),
          t(static_cast<int>(threadIdx.x) & 3) {}
    __device__ __forceinline__ int row(int hh) const { return 16 * warp + g + 8 * hh; }
};

// Sequence b's query and key ranges in the packed varlen layout.
struct TfSeq {
    int64_t q_start, q_len, k_start, k_len;
    __device__ __forceinline__ TfSeq(const int32_t* cu_q, const int32_t* cu_k, int64_t b)
        : q_start(cu_q[b]), q_len(static_cast<int64_t>(cu_q[b + 1]) - cu_q[b]), k_start(cu_k[b]),
          k_len(static_cast<int64_t>(cu_k[b + 1]) - cu_k[b]) {}
};

// Longest programs first, as the Triton kernels' _heavy_first: block i of a 1-D grid of n_blocks * batch *
// heads owns (sequence b, head h, tile blk), the tile varying slowest, from the last down when REVERSE
// (the forward's and dQ's query tiles: causal work grows with the index) or from tile 0 up (dK / dV's key
// blocks: work shrinks with it), then the sequence, then the head (adjacent query heads share a KV head).
// Blocks start roughly in launch order, so the longest no longer start last and leave SMs idle at the end
// of the launch. Only which block computes which tile changes, never a tile's arithmetic.
struct TfTile {
    int64_t b, h, blk;
    __device__ __forceinline__ TfTile(int64_t n_blocks, int64_t heads, bool reverse) {
        const int64_t pid = blockIdx.x;
        const int64_t per_tile = static_cast<int64_t>(gridDim.x) / n_blocks;  // batch * heads
        const int64_t i = pid / per_tile, rem = pid % per_tile;
        blk = reverse ? n_blocks - 1 - i : i;
        b = rem / heads;
        h = rem % heads;
    }
};

// x clamped to [-1, TF_ROWS]: compared with a column c in [0, TF_ROWS) it gives the same answer as the
// 64-bit x, in 32 bits (a block's visibility test per element without 64-bit compares).
__device__ __forceinline__ int tf_rel(int64_t x) {
    return x < -1 ? -1 : (x > TF_ROWS ? TF_ROWS : static_cast<int>(x));
}

// The size of TfTile's 1-D grid (0: nothing to launch), or -1 when it does not fit a grid's x dimension.
inline int64_t tf_tile_grid(int64_t n_blocks, int64_t batch, int64_t heads) {
    if (n_blocks <= 0 || batch <= 0 || heads <= 0) return 0;
    const int64_t n = n_blocks * batch * heads;  // n_blocks * batch and heads are already within a 2-D grid
    return n < 2147483647LL ? n : -1;
}

// Rows r < rows of a [64, D] accumulator tile rounded once to BF16 (times `mul` first when SCALE)
// at base + r * stride.
template <int D, bool SCALE>
__device__ __forceinline__ void tf_store_rows(const float (&acc)[D / 2], bf16* base, int64_t stride, int64_t rows,
                                              float mul) {
    const TfLane ln;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        if (ln.row(hh) >= rows) continue;
        bf16* row = base + ln.row(hh) * stride;
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const float x = acc[4 * j + 2 * hh + b];
                row[8 * j + 2 * ln.t + b] = to_bf16(SCALE ? x * mul : x);
            }
    }
}

// s[32] = A @ B^T for two 64-row tiles of shared memory (byte offsets a, b from the window's start;
// K-major, D columns): D / 16 wgmma m64n64k16 in increasing d, the first without accumulator input.
// Issued only: the caller commits and waits.
template <int D>
__device__ __forceinline__ void tf_scores(float (&s)[32], uint32_t a, uint32_t b) {
#pragma unroll
    for (int i = 0; i < D / 16; ++i) {
        const uint32_t step = static_cast<uint32_t>((i >> 2) * 8192 + (i & 3) * 32);
        wgmma_ss_n64(s, wg_desc_sw128(a + step), wg_desc_sw128(b + step), i > 0 ? 1 : 0);
    }
}

// acc[D / 2] += bf16(x) @ B: x [64, 64] FP32 in the S fragment (rounded here, cvt.rn.bf16x2.f32), B a
// 64-row tile (shared-memory byte offset b) read MN-major (its D columns are the output's): 4 wgmma
// m64nDk16 with x from registers, in increasing row of B. Fenced and issued only.
template <int D>
__device__ __forceinline__ void tf_rs_product(float (&acc)[D / 2], const float (&x)[32], uint32_t b) {
    uint32_t pa[4][4];  // rows 16 i .. 16 i + 15 of B = x's column groups 2 i, 2 i + 1
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int q = 0; q < 4; ++q) pa[i][q] = tf_pack(x[8 * i + 2 * q], x[8 * i + 2 * q + 1]);
    wg_fence();
#pragma unroll
    for (int i = 0; i < 4; ++i) wgmma_rs_t<D>(acc, pa[i], wg_desc_sw128_mn(b + 2048 * i, 8192));
}

// "Masked means absent" for the other operand of a product whose masked weights are 0 (the Triton
// kernels' _absent_mma): the non-finite values of a 64-row tile (generic pointer `tile`) become 0, and
// bad[d] gets the first (LAST: the last) row holding a non-finite value in column d, or 64 (LAST: -1)
// when none does. Thread d scans column d (threads past D idle). Needs a barrier before (the tile has
// landed, and no MMA reads it any more) and after (bad and the tile), then fence_proxy_async.
template <int D, bool LAST>
__device__ __forceinline__ void tf_absent_scan(unsigned char* tile, int* bad) {
    const int d = threadIdx.x;
    if (d >= D) return;
    int found = LAST ? -1 : TF_ROWS;
    for (int j = 0; j < TF_ROWS; ++j) {
        unsigned short* p = reinterpret_cast<unsigned short*>(tile + tf_off(j, d >> 3) + 2 * (d & 7));
        if ((*p & 0x7F80u) == 0x7F80u) {  // exponent all ones: inf or NaN
            *p = 0;
            if (LAST || found == TF_ROWS) found = j;
        }
    }
    bad[d] = found;
}

// Row hh of this thread (TfLane) in a key block's scores s (the S fragment of tf_scores), in place:
// s * scale; keys past the row's limit lim (when the block is not `full`) -inf, visible -inf -> NaN.
// Returns the row's maximum over the block's 64 keys: the thread's 16 values in increasing j, b, then
// lanes xor 1 and 2 (max.f32: NaN ignored). The order of the walk (tf_walk) and of the split decode.
__device__ __forceinline__ float tf_row_max(float (&s)[32], int hh, int64_t kv0, bool full, int64_t lim, float scale,
                                            int t) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int b = 0; b < 2; ++b) {
            float x = s[4 * j + 2 * hh + b] * scale;
            if (full) {
                x = x == -INFINITY ? tf_nan() : x;
            } else {
                const bool keep = kv0 + 8 * j + 2 * t + b <= lim;
                x = keep ? (x == -INFINITY ? tf_nan() : x) : -INFINITY;
            }
            s[4 * j + 2 * hh + b] = x;
            mx = fmaxf(mx, x);
        }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    return mx;
}

// Row hh's probabilities p = tl_exp(s - ref) in place, and their sum over the block's 64 keys in
// fragment_row_sum's order (key index bit 0 in the pair, bits 3, 4, 5 in the thread, then 2 and 1 across
// lanes).
__device__ __forceinline__ float tf_row_exp_sum(float (&s)[32], int hh, float ref) {
    float pair[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const float p0 = tl_exp(s[4 * j + 2 * hh] - ref);
        const float p1 = tl_exp(s[4 * j + 2 * hh + 1] - ref);
        s[4 * j + 2 * hh] = p0;
        s[4 * j + 2 * hh + 1] = p1;
        pair[j] = p0 + p1;  // key index bit 0
    }
    const float q0 = pair[0] + pair[1], q1 = pair[2] + pair[3], q2 = pair[4] + pair[5], q3 = pair[6] + pair[7];
    float sum = (q0 + q1) + (q2 + q3);                 // bits 3, 4, 5
    sum = sum + __shfl_xor_sync(0xffffffffu, sum, 2);  // bit 2
    sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);  // bit 1
    return sum;
}

// acc *= alpha of the element's row (the accumulator fragment's rows hh = e >> 1).
template <int D>
__device__ __forceinline__ void tf_rescale(float (&acc)[D / 2], const float (&alpha)[2]) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[4 * j + e] = acc[4 * j + e] * alpha[e >> 1];
}

// After P V of a block holding masked keys: an accumulator element that a kept non-finite value of V
// reaches (its column's first such key, first_bad from tf_absent_scan, within the row's limit lim)
// becomes NaN; masked ones never do.
template <int D>
__device__ __forceinline__ void tf_absent_nan(float (&acc)[D / 2], const int* first_bad, int64_t kv0,
                                              const int64_t (&lim)[2], int t) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int bad = first_bad[8 * j + 2 * t + (e & 1)];
            if (bad < TF_ROWS && kv0 + bad <= lim[e >> 1]) acc[4 * j + e] = tf_nan();
        }
}

// A two-stage ring of KV blocks in shared memory: block jb's K tile at tile index first + 2 (jb % 2),
// its V tile right after; rows from kv_len on zero-filled. issue(jb) starts the copies of block jb
// (none past the last block) and commits them as one group, so cp_async_wait<1> at block jb means
// "block jb has landed" when blocks jb and jb + 1 were issued before it.
template <int D>
struct TfKvRing {
    unsigned char* smem;
    const bf16* k;
    const bf16* v;
    int64_t s_k, s_v, kv_len, n_blocks;
    int first;
    bool vec;

    __device__ __forceinline__ TfKvRing(unsigned char* smem_, const bf16* k_, int64_t s_k_, const bf16* v_,
                                        int64_t s_v_, int64_t kv_len_, int64_t n_stop, int first_)
        : smem(smem_), k(k_), v(v_), s_k(s_k_), s_v(s_v_), kv_len(kv_len_),
          n_blocks(cdiv(n_stop, static_cast<int64_t>(TF_ROWS))), first(first_),
          vec(aligned16(k_) && aligned16(v_) && s_k_ % 8 == 0 && s_v_ % 8 == 0) {}
    __device__ __forceinline__ uint32_t k_tile(int64_t jb) const {
        return TfShape<D>::TILE * static_cast<uint32_t>(first + 2 * (jb & 1));
    }
    __device__ __forceinline__ void issue(int64_t jb) const {
        if (jb < n_blocks) {
            const int64_t kv0 = jb * TF_ROWS;
            tf_load<D>(smem, k_tile(jb), k + kv0 * s_k, s_k, kv_len - kv0, vec);
            tf_load<D>(smem, k_tile(jb) + TfShape<D>::TILE, v + kv0 * s_v, s_v, kv_len - kv0, vec);
        }
        cp_async_commit();  // (an empty group past the last block keeps the wait count uniform)
    }
};

// One thread's part of a 64-row tile after the KV walk: rows 16 w + g + 8 h (h = 0, 1) of the tile,
// columns 8 j + 2 t + b of the accumulator in acc[4 j + 2 h + b].
template <int D>
struct TfState {
    float acc[D / 2];
    float m[2];
    float l[2];
};

// The walk over KV blocks [0, n_stop) of one tile (the Triton kernel's _kv_loop): blocks below n_full
// are seen whole by every real row (plain step), the rest hold masked entries. Row r of the tile is
// real when r < q_valid and then sees keys <= lim0 + r * lim_step; its query is q_base + r * s_q.
template <int D>
__device__ __forceinline__ void tf_walk(unsigned char* smem, TfState<D>& st, const bf16* q_base, int64_t s_q,
                                        int64_t q_valid, const bf16* k_base, int64_t s_k, const bf16* v_base,
                                        int64_t s_v, int64_t kv_len, int64_t n_full, int64_t n_stop, int64_t lim0,
                                        int64_t lim_step, float scale) {
    using S = TfShape<D>;
    const TfLane ln;
    const int t = ln.t;
    int64_t lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = ln.row(h);
        lim[h] = r < q_valid ? lim0 + r * lim_step : -1;
        st.m[h] = -INFINITY;
        st.l[h] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < D / 2; ++e) st.acc[e] = 0.0f;
    int* first_bad = reinterpret_cast<int*>(smem + 5 * S::TILE);  // [D]: first non-finite key of a V column

    const TfKvRing<D> ring(smem, k_base, s_k, v_base, s_v, kv_len, n_stop, 1);
    tf_load<D>(smem, 0, q_base, s_q, q_valid, aligned16(q_base) && s_q % 8 == 0);
    ring.issue(0);
    ring.issue(1);

    const uint32_t base = smem_u32(smem);
    for (int64_t jb = 0; jb < ring.n_blocks; ++jb) {
        const int64_t kv0 = jb * TF_ROWS;
        const uint32_t k_tile = base + ring.k_tile(jb);
        const uint32_t v_tile = k_tile + S::TILE;
        const bool full = kv0 < n_full;
        cp_async_wait<1>();
        __syncthreads();  // block jb's tiles (and Q) have landed for every thread
        if (!full) {  // masked block: V's non-finite values -> 0, the first such key of each column
            tf_absent_scan<D, false>(smem + (v_tile - base), first_bad);
            __syncthreads();
        }
        fence_proxy_async();  // the tiles (cp.async or generic stores) are visible to the MMAs' reads

        float s[32];
        wg_fence();
        tf_scores<D>(s, base, k_tile);
        wg_commit();
        wg_wait0();

        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float mx = tf_row_max(s, h, kv0, full, lim[h], scale, t);
            const float m_new = fmaxf(st.m[h], mx);
            const float ref = m_new == -INFINITY ? 0.0f : m_new;
            alpha[h] = m_new == st.m[h] ? 1.0f : tl_exp(st.m[h] - ref);
            const float sum = tf_row_exp_sum(s, h, ref);
            st.l[h] = st.l[h] * alpha[h] + sum;
            st.m[h] = m_new;
        }
        tf_rescale<D>(st.acc, alpha);
        tf_rs_product<D>(st.acc, s, v_tile);
        wg_commit();
        wg_wait0();
        if (!full) tf_absent_nan<D>(st.acc, first_bad, kv0, lim, t);
        __syncthreads();  // every warp is done with this stage (and first_bad)
        ring.issue(jb + 2);
    }
    cp_async_wait<0>();
}

// Row r of the tile: out = div_rn(acc, l != 0 ? l : 1) rounded to BF16 at orow(r), and (lse != nullptr)
// lse = l != 0 ? m + logf(l) : 0 at lse[r * s_l], for rows r < valid.
template <int D>
__device__ __forceinline__ void tf_store(const TfState<D>& st, bf16* o_base, int64_t s_o, float* lse, int64_t s_l,
                                         int64_t valid) {
    const TfLane ln;
    const int t = ln.t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = ln.row(h);
        if (r >= valid) continue;
        const bool has = st.l[h] != 0.0f;  // 0: no visible key; NaN: a visible non-finite value
        const float den = has ? st.l[h] : 1.0f;
        bf16* orow = o_base + r * s_o;
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            orow[8 * j + 2 * t] = to_bf16(__fdiv_rn(st.acc[4 * j + 2 * h], den));
            orow[8 * j + 2 * t + 1] = to_bf16(__fdiv_rn(st.acc[4 * j + 2 * h + 1], den));
        }
        if (lse != nullptr && t == 0) lse[r * s_l] = has ? st.m[h] + logf(den) : 0.0f;
    }
}

// Varlen prefill: a block owns queries [q0, q0 + 64) of sequence b, head h (TfTile: the last query
// tiles first).
template <int D>
__global__ void __launch_bounds__(TF_THREADS)
attn_fwd_tc_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                   bf16* __restrict__ out, float* __restrict__ lse, const int32_t* __restrict__ cu_q,
                   const int32_t* __restrict__ cu_k, int64_t n_mblocks, int64_t heads, int64_t group, int64_t s_qt,
                   int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_ot, int64_t s_oh,
                   int64_t s_lh, float scale) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];  // the swizzle needs 1024-byte tiles
    if (smem_u32(smem_raw) & 1023u) __trap();
    const TfTile tile(n_mblocks, heads, true);
    const int64_t q0 = tile.blk * TF_ROWS;
    const int64_t h = tile.h;
    const TfSeq sq(cu_q, cu_k, tile.b);
    const int64_t q_start = sq.q_start, q_len = sq.q_len, k_start = sq.k_start, k_len = sq.k_len;
    if (q0 >= q_len) return;  // uniform over the block
    const int64_t kvh = h / group;
    const int64_t rows = q_len - q0 < TF_ROWS ? q_len - q0 : TF_ROWS;
    const int64_t first_limit = k_len - q_len + q0;  // the tile's first row's causal limit
    const int64_t n_stop = first_limit + TF_ROWS < k_len ? first_limit + TF_ROWS : k_len;
    const int64_t n_full = ((first_limit + 1) / TF_ROWS) * TF_ROWS;  // floor, as Triton's // (>= 0 here)
    TfState<D> st;
    tf_walk<D>(smem_raw, st, q + (q_start + q0) * s_qt + h * s_qh, s_qt, rows, k + k_start * s_kt + kvh * s_kh, s_kt,
               v + k_start * s_vt + kvh * s_vh, s_vt, k_len, n_full, n_stop, first_limit, 1, scale);
    tf_store<D>(st, out + (q_start + q0) * s_ot + h * s_oh, s_ot, lse + h * s_lh + q_start + q0, 1, rows);
}

// Decode step: block (b, kvh, tile) owns query heads [64 tile, 64 tile + 64) of KV group kvh of
// sequence b (rows past the group are padding), every row seeing keys [0, seqlens[b]).
template <int D>
__global__ void __launch_bounds__(TF_THREADS)
attn_decode_tc_kernel(const bf16* __restrict__ q, const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                      bf16* __restrict__ out, const int32_t* __restrict__ seqlens, int64_t group, int64_t s_qb,
                      int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh,
                      int64_t s_ob, int64_t s_oh, float scale) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    if (smem_u32(smem_raw) & 1023u) __trap();
    const int64_t b = blockIdx.x;
    const int64_t kvh = blockIdx.y;
    const int64_t g0 = static_cast<int64_t>(blockIdx.z) * TF_ROWS;
    const int64_t n = seqlens[b];
    const int64_t rows = group - g0 < TF_ROWS ? group - g0 : TF_ROWS;
    const int64_t head0 = kvh * group + g0;
    TfState<D> st;
    tf_walk<D>(smem_raw, st, q + b * s_qb + head0 * s_qh, s_qh, rows, kc + b * s_kb + kvh * s_kh, s_kt,
               vc + b * s_vb + kvh * s_vh, s_vt, n, (n / TF_ROWS) * TF_ROWS, n, n - 1, 0, scale);
    tf_store<D>(st, out + b * s_ob + head0 * s_oh, s_oh, nullptr, 0, rows);
}

// ------------------------------------------------------------------------- the split decode step
// The same decode step in three launches, for grids of few (sequence, KV head) blocks, where the walk
// above is one block walking the key blocks one after another (B = 1 at Qwen3-8B: 8 blocks). What the
// walk computes per key block jb and row is split by what it depends on:
//   1. per key block, in parallel: S (tf_scores) and the row maximum mx_jb (tf_row_max);
//   2. per key block, in parallel: S again (the same MMAs), the running maximum m_jb = fmaxf(...
//      fmaxf(fmaxf(-inf, mx_0), mx_1) ..., mx_jb) folded in the walk's order from step 1's maxima,
//      alpha_jb and the probabilities and row sum of the block (tf_row_exp_sum), P packed to BF16 as the
//      P V product's register operand;
//   3. per (sequence, KV head, 64-head tile), the walk's remaining chain over the blocks in order:
//      l = l * alpha + sum, acc = acc * alpha, acc += P V (the same wgmma from registers), the absent
//      value rule in the masked block, then out = div_rn(acc, l).
// Every value is computed by the same instructions from the same operands as in the walk, so the
// bits are the walk's (tests/ops/test_cuda_backend.py compares them). Scratch per (sequence, KV head,
// tile, key block) "unit" u, for U units: the maxima [U][64] FP32, alpha [U][64], the sums [U][64], then P
// [U][128 threads][16] packed BF16 pairs.
constexpr int64_t TS_UNIT_BYTES = 3 * TF_ROWS * 4 + TF_THREADS * 16 * 4;
constexpr int TS_STAGES = 4;  // step 3's ring of (V tile, P, alpha and sums) per key block

struct TsScratch {
    float* mx;
    float* alpha;
    float* sum;
    uint32_t* p;
    __device__ __forceinline__ TsScratch(void* base, int64_t units)
        : mx(static_cast<float*>(base)), alpha(mx + units * TF_ROWS), sum(alpha + units * TF_ROWS),
          p(reinterpret_cast<uint32_t*>(sum + units * TF_ROWS)) {}
};

// Steps 1 (STEP 1: write the block's row maxima) and 2 (STEP 2: alpha, the sums and P). Block
// (jb, kvh * tiles + tile, b); blocks past the sequence's last key block return.
template <int D, int STEP>
__global__ void __launch_bounds__(TF_THREADS)
attn_decode_split_kernel(const bf16* __restrict__ q, const bf16* __restrict__ kc, const int32_t* __restrict__ seqlens,
                         void* __restrict__ scratch, int64_t group, int64_t kv_heads, int64_t n_kv_blocks, int64_t s_qb,
                         int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, float scale) {
    using S = TfShape<D>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    if (smem_u32(smem_raw) & 1023u) __trap();
    const int64_t jb = blockIdx.x;
    const int64_t tiles = cdiv(group, static_cast<int64_t>(TF_ROWS));
    const int64_t kvh = blockIdx.y / tiles;
    const int64_t g0 = (blockIdx.y % tiles) * TF_ROWS;
    const int64_t b = blockIdx.z;
    const int64_t n = seqlens[b];
    const int64_t kv0 = jb * TF_ROWS;
    if (kv0 >= n) return;  // uniform over the block
    const int64_t rows = group - g0 < TF_ROWS ? group - g0 : TF_ROWS;
    const int64_t head0 = kvh * group + g0;
    const int64_t units = static_cast<int64_t>(gridDim.z) * kv_heads * tiles * n_kv_blocks;
    const int64_t u0 = ((b * kv_heads + kvh) * tiles + (blockIdx.y % tiles)) * n_kv_blocks;  // the tile's unit 0
    const TsScratch sc(scratch, units);
    const bf16* q_base = q + b * s_qb + head0 * s_qh;
    const bf16* k_base = kc + b * s_kb + kvh * s_kh + kv0 * s_kt;
    tf_load<D>(smem_raw, 0, q_base, s_qh, rows, aligned16(q_base) && s_qh % 8 == 0);
    tf_load<D>(smem_raw, S::TILE, k_base, s_kt, n - kv0, aligned16(k_base) && s_kt % 8 == 0);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    fence_proxy_async();
    const uint32_t base = smem_u32(smem_raw);
    float s[32];
    wg_fence();
    tf_scores<D>(s, base, base + S::TILE);
    wg_commit();
    wg_wait0();
    const TfLane ln;
    const bool full = kv0 < (n / TF_ROWS) * TF_ROWS;
    float alpha[2], sum[2], mx[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = ln.row(h);
        mx[h] = tf_row_max(s, h, kv0, full, r < rows ? n - 1 : -1, scale, ln.t);
        if (STEP == 2) {
            // the running maximum before this block, folded in the walk's order (16 loads in flight)
            const float* mrow = sc.mx + u0 * TF_ROWS + r;
            float m = -INFINITY;
            int64_t i = 0;
            for (; i + 16 <= jb; i += 16) {
                float w[16];
#pragma unroll
                for (int k = 0; k < 16; ++k) w[k] = mrow[(i + k) * TF_ROWS];
#pragma unroll
                for (int k = 0; k < 16; ++k) m = fmaxf(m, w[k]);
            }
            for (; i < jb; ++i) m = fmaxf(m, mrow[i * TF_ROWS]);
            const float m_new = fmaxf(m, mx[h]);
            const float ref = m_new == -INFINITY ? 0.0f : m_new;
            alpha[h] = m_new == m ? 1.0f : tl_exp(m - ref);
            sum[h] = tf_row_exp_sum(s, h, ref);
        }
    }
    const int64_t u = u0 + jb;
    if (STEP == 1) {
        if (ln.t == 0)
#pragma unroll
            for (int h = 0; h < 2; ++h) sc.mx[u * TF_ROWS + ln.row(h)] = mx[h];
        return;
    }
    if (ln.t == 0)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            sc.alpha[u * TF_ROWS + ln.row(h)] = alpha[h];
            sc.sum[u * TF_ROWS + ln.row(h)] = sum[h];
        }
    uint4* pd = reinterpret_cast<uint4*>(sc.p + (u * TF_THREADS + threadIdx.x) * 16);
#pragma unroll
    for (int i = 0; i < 4; ++i)  // tf_rs_product's operand rows 16 i .. 16 i + 15
        pd[i] = make_uint4(tf_pack(s[8 * i], s[8 * i + 1]), tf_pack(s[8 * i + 2], s[8 * i + 3]),
                           tf_pack(s[8 * i + 4], s[8 * i + 5]), tf_pack(s[8 * i + 6], s[8 * i + 7]));
}

// Step 3: block (b, kvh, tile). Shared memory: TS_STAGES V tiles, then per stage P (8 KB) and alpha and the
// sums (512 bytes), then the first non-finite key of each V column.
template <int D>
struct TsShape {
    static constexpr uint32_t P_AT = TS_STAGES * TfShape<D>::TILE;
    static constexpr uint32_t AS_AT = P_AT + TS_STAGES * TF_THREADS * 64;
    static constexpr uint32_t BAD_AT = AS_AT + TS_STAGES * 2 * TF_ROWS * 4;
    static constexpr size_t SMEM = BAD_AT + D * sizeof(int);
};

template <int D>
__global__ void __launch_bounds__(TF_THREADS)
attn_decode_split_pv_kernel(const bf16* __restrict__ vc, bf16* __restrict__ out, const int32_t* __restrict__ seqlens,
                            const void* __restrict__ scratch, int64_t group, int64_t n_kv_blocks, int64_t s_vb,
                            int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh) {
    using S = TfShape<D>;
    using T = TsShape<D>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    if (smem_u32(smem_raw) & 1023u) __trap();
    const int64_t b = blockIdx.x;
    const int64_t kvh = blockIdx.y;
    const int64_t tiles = gridDim.z;
    const int64_t g0 = static_cast<int64_t>(blockIdx.z) * TF_ROWS;
    const int64_t n = seqlens[b];
    const int64_t rows = group - g0 < TF_ROWS ? group - g0 : TF_ROWS;
    const int64_t head0 = kvh * group + g0;
    const int64_t units = static_cast<int64_t>(gridDim.x) * gridDim.y * tiles * n_kv_blocks;
    const int64_t u0 = ((b * gridDim.y + kvh) * tiles + blockIdx.z) * n_kv_blocks;
    const TsScratch sc(const_cast<void*>(scratch), units);
    const bf16* v_base = vc + b * s_vb + kvh * s_vh;
    const bool vec = aligned16(v_base) && s_vt % 8 == 0;
    const int64_t n_blocks = cdiv(n, static_cast<int64_t>(TF_ROWS));
    const int64_t n_full = (n / TF_ROWS) * TF_ROWS;
    const int tid = threadIdx.x;
    const uint32_t base = smem_u32(smem_raw);
    auto issue = [&](int64_t jb) {
        if (jb < n_blocks) {
            const int slot = static_cast<int>(jb % TS_STAGES);
            const int64_t kv0 = jb * TF_ROWS;
            tf_load<D>(smem_raw, S::TILE * slot, v_base + kv0 * s_vt, s_vt, n - kv0, vec);
            const int64_t u = u0 + jb;
#pragma unroll
            for (int i = 0; i < 4; ++i)
                cp_async16_s(base + T::P_AT + (slot * TF_THREADS + tid) * 64 + 16 * i,
                             sc.p + (u * TF_THREADS + tid) * 16 + 4 * i, 16);
            if (tid < 32) {  // alpha (chunks 0 .. 15), then the sums (16 .. 31)
                const float* src = (tid < 16 ? sc.alpha : sc.sum) + u * TF_ROWS + 4 * (tid & 15);
                cp_async16_s(base + T::AS_AT + slot * 512 + 16 * tid, src, 16);
            }
        }
        cp_async_commit();
    };
    const TfLane ln;
    TfState<D> st;  // m stays unused: a decode step writes no lse
    int64_t lim[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        lim[h] = ln.row(h) < rows ? n - 1 : -1;
        st.l[h] = 0.0f;
        st.m[h] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < D / 2; ++e) st.acc[e] = 0.0f;
    int* first_bad = reinterpret_cast<int*>(smem_raw + T::BAD_AT);
#pragma unroll
    for (int i = 0; i < TS_STAGES; ++i) issue(i);
    for (int64_t jb = 0; jb < n_blocks; ++jb) {
        const int slot = static_cast<int>(jb % TS_STAGES);
        const int64_t kv0 = jb * TF_ROWS;
        const bool full = kv0 < n_full;
        cp_async_wait<TS_STAGES - 1>();
        __syncthreads();  // block jb's V tile, P, alpha and sums have landed for every thread
        if (!full) {      // as the walk: V's non-finite values -> 0, the first such key of each column
            tf_absent_scan<D, false>(smem_raw + S::TILE * slot, first_bad);
            __syncthreads();
        }
        fence_proxy_async();
        const float* as = reinterpret_cast<const float*>(smem_raw + T::AS_AT + slot * 512);
        float alpha[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            alpha[h] = as[ln.row(h)];
            st.l[h] = st.l[h] * alpha[h] + as[TF_ROWS + ln.row(h)];
        }
        tf_rescale<D>(st.acc, alpha);
        uint32_t pa[4][4];
        const uint4* ps = reinterpret_cast<const uint4*>(smem_raw + T::P_AT + (slot * TF_THREADS + tid) * 64);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 w = ps[i];
            pa[i][0] = w.x;
            pa[i][1] = w.y;
            pa[i][2] = w.z;
            pa[i][3] = w.w;
        }
        wg_fence();
#pragma unroll
        for (int i = 0; i < 4; ++i) wgmma_rs_t<D>(st.acc, pa[i], wg_desc_sw128_mn(base + S::TILE * slot + 2048 * i, 8192));
        wg_commit();
        wg_wait0();
        if (!full) tf_absent_nan<D>(st.acc, first_bad, kv0, lim, ln.t);
        __syncthreads();  // every warp is done with this stage (and first_bad)
        issue(jb + TS_STAGES);
    }
    cp_async_wait<0>();
    tf_store<D>(st, out + b * s_ob + head0 * s_oh, s_oh, nullptr, 0, rows);
}

template <int D>
int launch_fwd_tc_d(const void* q, const void* k, const void* v, void* out, void* lse, const void* cu_q,
                    const void* cu_k, int64_t batch, int64_t n_mblocks, int64_t heads, int64_t group, int64_t s_qt,
                    int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_ot, int64_t s_oh,
                    int64_t s_lh, float scale, cudaStream_t st) {
    constexpr size_t smem = TfShape<D>::SMEM;
    const int64_t grid = tf_tile_grid(n_mblocks, batch, heads);
    if (grid <= 0) return grid == 0 ? 0 : static_cast<int>(cudaErrorInvalidValue);
    if (int e = prepare(attn_fwd_tc_kernel<D>, smem)) return e;
    attn_fwd_tc_kernel<D><<<static_cast<unsigned>(grid), TF_THREADS, smem, st>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v), static_cast<bf16*>(out),
        static_cast<float*>(lse), static_cast<const int32_t*>(cu_q), static_cast<const int32_t*>(cu_k), n_mblocks,
        heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale);
    return launch_status();
}

template <int D>
int launch_decode_tc_d(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, int64_t batch,
                       int64_t kv_heads, int64_t group, int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt,
                       int64_t s_kh, int64_t s_vb, int64_t s_vt, int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale,
                       cudaStream_t st) {
    constexpr size_t smem = TfShape<D>::SMEM;
    if (int e = prepare(attn_decode_tc_kernel<D>, smem)) return e;
    dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads),
              static_cast<unsigned>(cdiv(group, static_cast<int64_t>(TF_ROWS))));
    attn_decode_tc_kernel<D><<<grid, TF_THREADS, smem, st>>>(
        static_cast<const bf16*>(q), static_cast<const bf16*>(kc), static_cast<const bf16*>(vc), static_cast<bf16*>(out),
        static_cast<const int32_t*>(seqlens), group, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale);
    return launch_status();
}

template <int D>
int launch_decode_split_d(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* scratch,
                          int64_t batch, int64_t kv_heads, int64_t group, int64_t n_kv_blocks, int64_t s_qb,
                          int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt,
                          int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, cudaStream_t st) {
    const int64_t tiles = cdiv(group, static_cast<int64_t>(TF_ROWS));
    constexpr size_t smem = 2 * static_cast<size_t>(TfShape<D>::TILE);
    if (int e = prepare(attn_decode_split_kernel<D, 1>, smem)) return e;
    if (int e = prepare(attn_decode_split_kernel<D, 2>, smem)) return e;
    if (int e = prepare(attn_decode_split_pv_kernel<D>, TsShape<D>::SMEM)) return e;
    const dim3 grid(static_cast<unsigned>(n_kv_blocks), static_cast<unsigned>(kv_heads * tiles),
                    static_cast<unsigned>(batch));
    const bf16* qb = static_cast<const bf16*>(q);
    const bf16* kb = static_cast<const bf16*>(kc);
    const int32_t* lens = static_cast<const int32_t*>(seqlens);
    attn_decode_split_kernel<D, 1><<<grid, TF_THREADS, smem, st>>>(qb, kb, lens, scratch, group, kv_heads, n_kv_blocks,
                                                                  s_qb, s_qh, s_kb, s_kt, s_kh, scale);
    if (int e = launch_status()) return e;
    attn_decode_split_kernel<D, 2><<<grid, TF_THREADS, smem, st>>>(qb, kb, lens, scratch, group, kv_heads, n_kv_blocks,
                                                                  s_qb, s_qh, s_kb, s_kt, s_kh, scale);
    if (int e = launch_status()) return e;
    attn_decode_split_pv_kernel<D><<<dim3(static_cast<unsigned>(batch), static_cast<unsigned>(kv_heads),
                                          static_cast<unsigned>(tiles)),
                                     TF_THREADS, TsShape<D>::SMEM, st>>>(
        static_cast<const bf16*>(vc), static_cast<bf16*>(out), lens, scratch, group, n_kv_blocks, s_vb, s_vt, s_vh,
        s_ob, s_oh);
    return launch_status();
}

// ------------------------------------------------------------------------------------ backward
// The declared backward (rl_attention_bwd_form 2; attention_bwd.cu dispatches): the Triton backend's
// _attn_bwd_delta_kernel (with ROW_SUM_PINNED), _attn_bwd_dq_kernel and _attn_bwd_dkdv_kernel written out
// the same way as the forward above, on the same MMA instructions:
//   * delta[h, t] = sum_d f32(O) f32(dO) (exact products) in _head_dim_sum's order: each lane adds 8
//     consecutive columns pairwise (bits 0, 1, 2 of d), then the lanes of the row from the highest
//     remaining bit down (butterfly offsets D / 16, ..., 1);
//   * dQ, per 64-query tile, KV blocks from key 0 (plain below n_full, masked terms absent above):
//     S = Q K^T and dP = dO V^T (wgmma m64n64k16), p = visible ? tl_exp(S * scale - lse) : 0,
//     dS = p (dP - delta) (a masked block: 0 where not visible), dq += bf16(dS) K (wgmma, dS from
//     registers); dq * scale rounded once;
//   * dK / dV, per 64-key block of one KV head, the group's query heads in turn, each over its query
//     blocks from the one holding the first query that sees the block (the causal diagonal's blocks
//     first, masked terms absent there): S^T = K Q^T, dP^T = V dO^T, p^T = visible ? tl_exp(S^T * scale -
//     lse) : 0, dv += bf16(p^T) dO, dS^T = p^T (dP^T - delta), dk += bf16(dS^T) Q; dk * scale.
// The masked terms' other operand (K for dQ; dO and Q for dV and dK) has its non-finite values made 0
// for the product, and an output element a visible non-finite value reaches is NaN, with
// _absent_mma's predicate: for dQ the first non-finite key of a column at or below the row's limit,
// for dK / dV the last non-finite query of a column at or past the key's first seeing query.
template <int D>
struct TbShape {
    static constexpr uint32_t TILE = TfShape<D>::TILE;
    // dQ: Q, dO, then stage s: K at 2 + 2 s, V at 3 + 2 s; the first non-finite key per column of K.
    static constexpr size_t DQ_SMEM = 6 * static_cast<size_t>(TILE) + D * sizeof(int);
    // dK / dV: K, V, then stage s: Q at 2 + 2 s, dO at 3 + 2 s; lse and delta of each stage's 64 queries;
    // the last non-finite query per column of Q and of dO.
    static constexpr size_t DKDV_SMEM = 6 * static_cast<size_t>(TILE) + 4 * TF_ROWS * sizeof(float) + 2 * D * sizeof(int);
};

constexpr int TD_THREADS = 256;  // delta: 8 warps

template <int D>
__global__ void __launch_bounds__(TD_THREADS)
attn_delta_declared_kernel(const bf16* __restrict__ o, const bf16* __restrict__ dout, float* __restrict__ delta,
                           int64_t tq, int64_t heads, int64_t s_ot, int64_t s_oh, int64_t s_dt, int64_t s_dh,
                           int64_t s_lh) {
    constexpr int LPR = D / 8;         // lanes per (row, head): 8 consecutive columns each
    constexpr int RPW = 32 / LPR;      // (row, head) pairs per warp
    const int lane = threadIdx.x & 31;
    const int64_t idx = (static_cast<int64_t>(blockIdx.x) * (TD_THREADS / 32) + threadIdx.x / 32) * RPW + lane / LPR;
    const bool ok = idx < tq * heads;  // no early return: the butterfly needs every lane
    const int64_t t = ok ? idx / heads : 0;
    const int64_t h = ok ? idx % heads : 0;
    const int c0 = (lane % LPR) * 8;
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
        x[i] = ok ? f32(o[t * s_ot + h * s_oh + c0 + i]) * f32(dout[t * s_dt + h * s_dh + c0 + i]) : 0.0f;
    float y = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));  // bits 0, 1, 2
#pragma unroll
    for (int off = LPR / 2; off > 0; off >>= 1) y = y + __shfl_xor_sync(0xffffffffu, y, off);  // highest bit first
    if (ok && lane % LPR == 0) delta[h * s_lh + t] = y;
}

template <int D>
__global__ void __launch_bounds__(TF_THREADS)
attn_bwd_dq_declared_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                            const bf16* __restrict__ dout, const float* __restrict__ lse,
                            const float* __restrict__ delta, bf16* __restrict__ dq, const int32_t* __restrict__ cu_q,
                            const int32_t* __restrict__ cu_k, int64_t n_mblocks, int64_t heads, int64_t group,
                            int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh,
                            int64_t s_dt, int64_t s_dh, int64_t s_lh, int64_t s_gt, int64_t s_gh, float scale) {
    using S = TbShape<D>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    if (smem_u32(smem_raw) & 1023u) __trap();
    const TfTile tile(n_mblocks, heads, true);
    const int64_t m0 = tile.blk * TF_ROWS;
    const int64_t h = tile.h;
    const TfSeq sq(cu_q, cu_k, tile.b);
    const int64_t q_start = sq.q_start, q_len = sq.q_len, k_start = sq.k_start, k_len = sq.k_len;
    if (m0 >= q_len) return;  // uniform over the block
    const int64_t kvh = h / group;
    const int64_t offset = k_len - q_len;
    const int64_t rows = q_len - m0 < TF_ROWS ? q_len - m0 : TF_ROWS;
    const int64_t n_stop = offset + m0 + TF_ROWS < k_len ? offset + m0 + TF_ROWS : k_len;
    const int64_t n_full = ((offset + m0 + 1) / TF_ROWS) * TF_ROWS;
    const TfLane ln;
    const int t = ln.t;
    int64_t lim[2];
    float lse_r[2], delta_r[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = ln.row(hh);
        const bool ok = r < rows;
        lim[hh] = ok ? offset + m0 + r : -1;
        lse_r[hh] = ok ? lse[h * s_lh + q_start + m0 + r] : 0.0f;
        delta_r[hh] = ok ? delta[h * s_lh + q_start + m0 + r] : 0.0f;
    }
    float acc[D / 2];
#pragma unroll
    for (int e = 0; e < D / 2; ++e) acc[e] = 0.0f;
    int* first_bad = reinterpret_cast<int*>(smem_raw + 6 * S::TILE);

    const bf16* q_base = q + (q_start + m0) * s_qt + h * s_qh;
    const bf16* do_base = dout + (q_start + m0) * s_dt + h * s_dh;
    const TfKvRing<D> ring(smem_raw, k + k_start * s_kt + kvh * s_kh, s_kt, v + k_start * s_vt + kvh * s_vh, s_vt, k_len,
                           n_stop, 2);
    const bool vec_q = aligned16(q_base) && aligned16(do_base) && s_qt % 8 == 0 && s_dt % 8 == 0;
    tf_load<D>(smem_raw, 0, q_base, s_qt, rows, vec_q);
    tf_load<D>(smem_raw, S::TILE, do_base, s_dt, rows, vec_q);
    ring.issue(0);
    ring.issue(1);

    const uint32_t base = smem_u32(smem_raw);
    for (int64_t jb = 0; jb < ring.n_blocks; ++jb) {
        const int64_t kv0 = jb * TF_ROWS;
        const uint32_t k_tile = base + ring.k_tile(jb);
        const uint32_t v_tile = k_tile + S::TILE;
        const bool full = kv0 < n_full;
        cp_async_wait<1>();
        __syncthreads();
        fence_proxy_async();
        // row hh sees key kv0 + c (c in [0, 64)) when c <= rel[hh], i.e. kv0 + c <= lim[hh]
        const int rel[2] = {tf_rel(lim[0] - kv0), tf_rel(lim[1] - kv0)};
        float sc[32], dp[32];
        wg_fence();
        tf_scores<D>(sc, base, k_tile);
        wg_commit();
        tf_scores<D>(dp, base + S::TILE, v_tile);
        wg_commit();
        wg_wait1();  // S has landed: the exponentials below can overlap dP's MMAs (ptxas 13.0 puts 13 of 32 before the wait)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int hh = e >> 1;
                const float ex = tl_exp(sc[4 * j + e] * scale - lse_r[hh]);  // every element: no branch
                sc[4 * j + e] = 8 * j + 2 * t + (e & 1) <= rel[hh] ? ex : 0.0f;
            }
        wg_wait0();
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int hh = e >> 1;
                const bool vis = 8 * j + 2 * t + (e & 1) <= rel[hh];
                const float ds = sc[4 * j + e] * (dp[4 * j + e] - delta_r[hh]);
                sc[4 * j + e] = full ? ds : (vis ? ds : 0.0f);
            }
        if (!full) {  // K's non-finite values -> 0 for dS K (the scores above read them unchanged)
            __syncthreads();
            tf_absent_scan<D, false>(smem_raw + (k_tile - base), first_bad);
            __syncthreads();
            fence_proxy_async();
        }
        tf_rs_product<D>(acc, sc, k_tile);
        wg_commit();
        wg_wait0();
        if (!full) tf_absent_nan<D>(acc, first_bad, kv0, lim, t);  // dQ: K's kept non-finite values
        __syncthreads();
        ring.issue(jb + 2);
    }
    cp_async_wait<0>();
    tf_store_rows<D, true>(acc, dq + (q_start + m0) * s_gt + h * s_gh, s_gt, rows, scale);
}

template <int D>
__global__ void __launch_bounds__(TF_THREADS)
attn_bwd_dkdv_declared_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                              const bf16* __restrict__ dout, const float* __restrict__ lse,
                              const float* __restrict__ delta, bf16* __restrict__ dk, bf16* __restrict__ dv,
                              const int32_t* __restrict__ cu_q, const int32_t* __restrict__ cu_k, int64_t n_nblocks,
                              int64_t kv_heads, int64_t group, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh,
                              int64_t s_vt, int64_t s_vh, int64_t s_dt, int64_t s_dh, int64_t s_lh, int64_t s_gkt,
                              int64_t s_gkh, int64_t s_gvt, int64_t s_gvh, float scale) {
    using S = TbShape<D>;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    if (smem_u32(smem_raw) & 1023u) __trap();
    const TfTile tile(n_nblocks, kv_heads, false);
    const int64_t n0 = tile.blk * TF_ROWS;
    const int64_t kvh = tile.h;
    const TfSeq sq(cu_q, cu_k, tile.b);
    const int64_t q_start = sq.q_start, q_len = sq.q_len, k_start = sq.k_start, k_len = sq.k_len;
    if (n0 >= k_len) return;  // uniform over the block
    const int64_t offset = k_len - q_len;  // position of query 0
    const int64_t keys = k_len - n0 < TF_ROWS ? k_len - n0 : TF_ROWS;
    // the first query block holding a query that sees key n0; from m_full on every query sees the block
    const int64_t m_begin = ((n0 - offset > 0 ? n0 - offset : 0) / TF_ROWS) * TF_ROWS;
    const int64_t first_full = n0 + TF_ROWS - 1 - offset > 0 ? n0 + TF_ROWS - 1 - offset : 0;
    int64_t m_full = cdiv(first_full, static_cast<int64_t>(TF_ROWS)) * TF_ROWS;
    m_full = m_full > m_begin ? m_full : m_begin;
    m_full = m_full < q_len ? m_full : q_len;
    const int64_t per_head = m_begin < q_len ? cdiv(q_len - m_begin, static_cast<int64_t>(TF_ROWS)) : 0;
    const int64_t steps = group * per_head;

    const int tid = threadIdx.x;
    const TfLane ln;
    const int t = ln.t;
    int64_t key[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) key[hh] = n0 + ln.row(hh);
    float acc_k[D / 2], acc_v[D / 2];
#pragma unroll
    for (int e = 0; e < D / 2; ++e) {
        acc_k[e] = 0.0f;
        acc_v[e] = 0.0f;
    }
    float* stats = reinterpret_cast<float*>(smem_raw + 6 * S::TILE);  // [stage][lse 64, delta 64]
    int* bad_q = reinterpret_cast<int*>(stats + 4 * TF_ROWS);
    int* bad_do = bad_q + D;

    const bf16* k_base = k + (k_start + n0) * s_kt + kvh * s_kh;
    const bf16* v_base = v + (k_start + n0) * s_vt + kvh * s_vh;
    const bool vec_kv = aligned16(k_base) && aligned16(v_base) && s_kt % 8 == 0 && s_vt % 8 == 0;
    auto issue_step = [&](int64_t step) {
        if (step < steps) {
            const int64_t head = kvh * group + step / per_head;
            const int64_t m0 = m_begin + (step % per_head) * TF_ROWS;
            const uint32_t q_tile = S::TILE * (2 + 2 * (step & 1));
            const bf16* q_base = q + (q_start + m0) * s_qt + head * s_qh;
            const bf16* do_base = dout + (q_start + m0) * s_dt + head * s_dh;
            const bool vec = aligned16(q_base) && aligned16(do_base) && s_qt % 8 == 0 && s_dt % 8 == 0;
            tf_load<D>(smem_raw, q_tile, q_base, s_qt, q_len - m0, vec);
            tf_load<D>(smem_raw, q_tile + S::TILE, do_base, s_dt, q_len - m0, vec);
            if (tid < TF_ROWS) {  // generic stores: visible after the barrier that follows the wait
                const bool ok = m0 + tid < q_len;
                float* st = stats + (step & 1) * 2 * TF_ROWS;
                st[tid] = ok ? lse[head * s_lh + q_start + m0 + tid] : 0.0f;
                st[TF_ROWS + tid] = ok ? delta[head * s_lh + q_start + m0 + tid] : 0.0f;
            }
        }
        cp_async_commit();
    };
    tf_load<D>(smem_raw, 0, k_base, s_kt, keys, vec_kv);
    tf_load<D>(smem_raw, S::TILE, v_base, s_vt, keys, vec_kv);
    issue_step(0);
    issue_step(1);

    const uint32_t base = smem_u32(smem_raw);
    for (int64_t step = 0; step < steps; ++step) {
        const int64_t m0 = m_begin + (step % per_head) * TF_ROWS;
        const uint32_t q_tile = base + S::TILE * (2 + 2 * (step & 1));
        const uint32_t do_tile = q_tile + S::TILE;
        const float* st = stats + (step & 1) * 2 * TF_ROWS;
        const bool absent = m0 < m_full;  // the causal diagonal's blocks: masked terms absent
        cp_async_wait<1>();
        __syncthreads();
        fence_proxy_async();
        // key row hh sees query m0 + c (c in [0, 64)) when lo[hh] <= c < hi, i.e. key <= offset + m0 + c,
        // m0 + c < q_len and key < k_len
        const int hi = tf_rel(q_len - m0);
        int lo[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) lo[hh] = key[hh] < k_len ? tf_rel(key[hh] - offset - m0) : TF_ROWS;
        float pt[32], dpt[32];
        wg_fence();
        tf_scores<D>(pt, base, q_tile);  // S^T = K Q^T
        wg_commit();
        tf_scores<D>(dpt, base + S::TILE, do_tile);  // dP^T = V dO^T
        wg_commit();
        wg_wait1();  // S^T has landed: the exponentials below can overlap dP^T's MMAs (18 of 32 before the wait)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * j + 2 * t + (e & 1);  // the query m0 + c
                const float ex = tl_exp(pt[4 * j + e] * scale - st[c]);  // every element: no branch
                pt[4 * j + e] = lo[e >> 1] <= c && c < hi ? ex : 0.0f;
            }
        wg_wait0();
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int c = 8 * j + 2 * t + (e & 1);
                const bool vis = lo[e >> 1] <= c && c < hi;
                const float ds = pt[4 * j + e] * (dpt[4 * j + e] - st[TF_ROWS + c]);
                dpt[4 * j + e] = absent ? (vis ? ds : 0.0f) : ds;
            }
        if (absent) {  // dO's and Q's non-finite values -> 0 for the products (S^T and dP^T read them unchanged)
            __syncthreads();
            tf_absent_scan<D, true>(smem_raw + (do_tile - base), bad_do);
            tf_absent_scan<D, true>(smem_raw + (q_tile - base), bad_q);
            __syncthreads();
            fence_proxy_async();
        }
        tf_rs_product<D>(acc_v, pt, do_tile);  // dv += bf16(p^T) dO
        tf_rs_product<D>(acc_k, dpt, q_tile);  // dk += bf16(dS^T) Q
        wg_commit();
        wg_wait0();
        if (absent) {  // a visible non-finite dO / Q value: the last such query sees the key when any does
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = 8 * j + 2 * t + (e & 1);
                    const int64_t kk = key[e >> 1];
                    const int bv = bad_do[col], bk = bad_q[col];
                    if (bv >= 0 && kk < k_len && kk <= offset + m0 + bv) acc_v[4 * j + e] = tf_nan();
                    if (bk >= 0 && kk < k_len && kk <= offset + m0 + bk) acc_k[4 * j + e] = tf_nan();
                }
        }
        __syncthreads();
        issue_step(step + 2);
    }
    cp_async_wait<0>();
    tf_store_rows<D, true>(acc_k, dk + (k_start + n0) * s_gkt + kvh * s_gkh, s_gkt, keys, scale);
    tf_store_rows<D, false>(acc_v, dv + (k_start + n0) * s_gvt + kvh * s_gvh, s_gvt, keys, 1.0f);
}

template <int D>
int launch_delta_declared_d(const void* o, const void* dout, void* delta, int64_t tq, int64_t heads, int64_t s_ot,
                            int64_t s_oh, int64_t s_dt, int64_t s_dh, int64_t s_lh, cudaStream_t st) {
    constexpr int64_t per_block = (TD_THREADS / 32) * (32 / (D / 8));
    const int64_t blocks = cdiv(tq * heads, per_block);
    if (blocks >= 2147483647LL) return static_cast<int>(cudaErrorInvalidValue);
    attn_delta_declared_kernel<D><<<static_cast<unsigned>(blocks), TD_THREADS, 0, st>>>(
        static_cast<const bf16*>(o), static_cast<const bf16*>(dout), static_cast<float*>(delta), tq, heads, s_ot, s_oh,
        s_dt, s_dh, s_lh);
    return launch_status();
}

template <int D>
int launch_bwd_declared_d(const void* q, const void* k, const void* v, const void* dout, const void* lse,
                          const void* delta, void* dq, void* dk, void* dv, const void* cu_q, const void* cu_k,
                          int64_t batch, int64_t n_mblocks, int64_t n_nblocks, int64_t heads, int64_t kv_heads,
                          int64_t group, int64_t s_qt, int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt,
                          int64_t s_vh, int64_t s_dt, int64_t s_dh, int64_t s_lh, int64_t s_gqt, int64_t s_gqh,
                          int64_t s_gkt, int64_t s_gkh, int64_t s_gvt, int64_t s_gvh, float scale, cudaStream_t st) {
    using S = TbShape<D>;
    if (int e = prepare(attn_bwd_dq_declared_kernel<D>, S::DQ_SMEM)) return e;
    if (int e = prepare(attn_bwd_dkdv_declared_kernel<D>, S::DKDV_SMEM)) return e;
    const bf16* qb = static_cast<const bf16*>(q);
    const bf16* kb = static_cast<const bf16*>(k);
    const bf16* vb = static_cast<const bf16*>(v);
    const bf16* db = static_cast<const bf16*>(dout);
    const float* lb = static_cast<const float*>(lse);
    const float* deb = static_cast<const float*>(delta);
    const int32_t* cq = static_cast<const int32_t*>(cu_q);
    const int32_t* ck = static_cast<const int32_t*>(cu_k);
    const int64_t kv_grid = tf_tile_grid(n_nblocks, batch, kv_heads);
    const int64_t q_grid = tf_tile_grid(n_mblocks, batch, heads);
    if (kv_grid < 0 || q_grid < 0) return static_cast<int>(cudaErrorInvalidValue);
    if (kv_grid > 0) {
        attn_bwd_dkdv_declared_kernel<D><<<static_cast<unsigned>(kv_grid), TF_THREADS, S::DKDV_SMEM, st>>>(
            qb, kb, vb, db, lb, deb, static_cast<bf16*>(dk), static_cast<bf16*>(dv), cq, ck, n_nblocks, kv_heads, group,
            s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_dt, s_dh, s_lh, s_gkt, s_gkh, s_gvt, s_gvh, scale);
        if (int e = launch_status()) return e;
    }
    if (q_grid == 0) return 0;
    attn_bwd_dq_declared_kernel<D><<<static_cast<unsigned>(q_grid), TF_THREADS, S::DQ_SMEM, st>>>(
        qb, kb, vb, db, lb, deb, static_cast<bf16*>(dq), cq, ck, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh, s_vt,
        s_vh, s_dt, s_dh, s_lh, s_gqt, s_gqh, scale);
    return launch_status();
}

int g_tf_decode_form = 0;  // 0: the library's choice (the walk); 1: the walk (one kernel); 2: the split step

int g_attn_fwd_form = 1;  // 1, the default since ws1-c1-v8: this file's declared form (head dims 64 and 128); 0: attention.cu's CUDA-core form

}  // namespace

namespace rl {
namespace attn {

bool fwd_uses_tc(int64_t head_dim) { return g_attn_fwd_form == 1 && (head_dim == 64 || head_dim == 128); }

int launch_fwd_tc(const void* q, const void* k, const void* v, void* out, void* lse, const void* cu_q, const void* cu_k,
                  int64_t batch, int64_t n_mblocks, int64_t heads, int64_t group, int64_t head_dim, int64_t s_qt,
                  int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_ot, int64_t s_oh,
                  int64_t s_lh, float scale, cudaStream_t st) {
    if (head_dim == 64)
        return launch_fwd_tc_d<64>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt,
                                   s_kh, s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
    return launch_fwd_tc_d<128>(q, k, v, out, lse, cu_q, cu_k, batch, n_mblocks, heads, group, s_qt, s_qh, s_kt, s_kh,
                                s_vt, s_vh, s_ot, s_oh, s_lh, scale, st);
}

// The library's choice (decode form 0): the split step where the walk's grid is at most this many
// blocks and its scratch at most TS_AUTO_MAX_BYTES. Measured on the H200 at Qwen3-8B heads
// (evidence/2026-12-05-h200-split-decode-52da2a0/, as CUDA graph replays): a walk of 8 blocks (B = 1)
// took 29.0 us at context 1024 and 179.8 us at 8192, the split step 28.4 and 131.8 us, and the B = 1
// decode step 5.656 -> 5.474 ms; from 32 blocks on the walk was faster (B = 4, context 1024: 30.0
// against 34.5 us; B = 16 and 64 by 2x and more).
constexpr int64_t TS_AUTO_MAX_WALK_BLOCKS = 8;
constexpr int64_t TS_AUTO_MAX_BYTES = int64_t(64) << 20;

int64_t decode_tc_scratch_bytes(int64_t batch, int64_t kv_heads, int64_t group, int64_t n_kv_blocks) {
    const int64_t tiles = cdiv(group, static_cast<int64_t>(TF_ROWS));
    // the split step's grids: (key blocks, KV heads x tiles, sequences); a shape they cannot hold
    // runs the walk, which gives the same bits
    const bool fits = batch <= 65535 && kv_heads * tiles <= 65535 && n_kv_blocks <= 2147483646LL;
    const int64_t bytes = fits ? batch * kv_heads * tiles * n_kv_blocks * TS_UNIT_BYTES : 0;
    const bool chosen = g_tf_decode_form == 0 && batch * kv_heads * tiles <= TS_AUTO_MAX_WALK_BLOCKS &&
                        bytes <= TS_AUTO_MAX_BYTES;
    return fits && (g_tf_decode_form == 2 || chosen) ? bytes : 0;
}

int launch_decode_tc(const void* q, const void* kc, const void* vc, void* out, const void* seqlens, void* scratch,
                     int64_t batch, int64_t kv_heads, int64_t group, int64_t head_dim, int64_t n_kv_blocks,
                     int64_t s_qb, int64_t s_qh, int64_t s_kb, int64_t s_kt, int64_t s_kh, int64_t s_vb, int64_t s_vt,
                     int64_t s_vh, int64_t s_ob, int64_t s_oh, float scale, cudaStream_t st) {
    if (decode_tc_scratch_bytes(batch, kv_heads, group, n_kv_blocks) > 0) {
        if (scratch == nullptr) return static_cast<int>(cudaErrorInvalidValue);
        if (head_dim == 64)
            return launch_decode_split_d<64>(q, kc, vc, out, seqlens, scratch, batch, kv_heads, group, n_kv_blocks,
                                             s_qb, s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, st);
        return launch_decode_split_d<128>(q, kc, vc, out, seqlens, scratch, batch, kv_heads, group, n_kv_blocks, s_qb,
                                          s_qh, s_kb, s_kt, s_kh, s_vb, s_vt, s_vh, s_ob, s_oh, scale, st);
    }
    if (head_dim == 64)
        return launch_decode_tc_d<64>(q, kc, vc, out, seqlens, batch, kv_heads, group, s_qb, s_qh, s_kb, s_kt, s_kh,
                                      s_vb, s_vt, s_vh, s_ob, s_oh, scale, st);
    return launch_decode_tc_d<128>(q, kc, vc, out, seqlens, batch, kv_heads, group, s_qb, s_qh, s_kb, s_kt, s_kh, s_vb,
                                   s_vt, s_vh, s_ob, s_oh, scale, st);
}

int launch_delta_declared(const void* o, const void* dout, void* delta, int64_t tq, int64_t heads, int64_t head_dim,
                          int64_t s_ot, int64_t s_oh, int64_t s_dt, int64_t s_dh, int64_t s_lh, cudaStream_t st) {
    if (head_dim == 64) return launch_delta_declared_d<64>(o, dout, delta, tq, heads, s_ot, s_oh, s_dt, s_dh, s_lh, st);
    return launch_delta_declared_d<128>(o, dout, delta, tq, heads, s_ot, s_oh, s_dt, s_dh, s_lh, st);
}

int launch_bwd_declared(const void* q, const void* k, const void* v, const void* dout, const void* lse, const void* delta,
                        void* dq, void* dk, void* dv, const void* cu_q, const void* cu_k, int64_t batch, int64_t n_mblocks,
                        int64_t n_nblocks, int64_t heads, int64_t kv_heads, int64_t group, int64_t head_dim, int64_t s_qt,
                        int64_t s_qh, int64_t s_kt, int64_t s_kh, int64_t s_vt, int64_t s_vh, int64_t s_dt, int64_t s_dh,
                        int64_t s_lh, int64_t s_gqt, int64_t s_gqh, int64_t s_gkt, int64_t s_gkh, int64_t s_gvt,
                        int64_t s_gvh, float scale, cudaStream_t st) {
    if (head_dim == 64)
        return launch_bwd_declared_d<64>(q, k, v, dout, lse, delta, dq, dk, dv, cu_q, cu_k, batch, n_mblocks, n_nblocks,
                                         heads, kv_heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_dt, s_dh, s_lh,
                                         s_gqt, s_gqh, s_gkt, s_gkh, s_gvt, s_gvh, scale, st);
    return launch_bwd_declared_d<128>(q, k, v, dout, lse, delta, dq, dk, dv, cu_q, cu_k, batch, n_mblocks, n_nblocks,
                                      heads, kv_heads, group, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_dt, s_dh, s_lh, s_gqt,
                                      s_gqh, s_gkt, s_gkh, s_gvt, s_gvh, scale, st);
}

}  // namespace attn
}  // namespace rl

// The attention forward's form for the process: 0 = attention.cu's CUDA-core form, 1 (the default
// since contract ws1-c1-v8) = the declared form of this file for head dims 64 and 128 (other head dims keep form 0), in the
// prefill and in every decode step (so prefill and decode stay bitwise equal). Returns the previous
// form, or -1 (and changes nothing) for another number.
RL_EXPORT int64_t rl_attention_fwd_form(int64_t form) {
    if (form < 0 || form > 1) return -1;
    const int64_t old = g_attn_fwd_form;
    g_attn_fwd_form = static_cast<int>(form);
    return old;
}

// 1 when the forward and decode of this head dim run the declared form in this process, else 0.
RL_EXPORT int64_t rl_attention_fwd_uses_tc(int64_t head_dim) { return fwd_uses_tc(head_dim) ? 1 : 0; }

// The declared form's decode step for the process: 0 = the library's choice (the split step for
// small grids, TS_AUTO_MAX_WALK_BLOCKS; else the one-kernel walk), 1 = the walk (attn_decode_tc_kernel), 2 = the split step in three launches (same bits; its
// scratch from rl_attention_declared_decode_scratch). Returns the previous setting, or -1 (and changes
// nothing) for another number.
RL_EXPORT int64_t rl_attention_declared_decode_form(int64_t form) {
    if (form < 0 || form > 2) return -1;
    const int64_t old = g_tf_decode_form;
    g_tf_decode_form = static_cast<int>(form);
    return old;
}

// Bytes of scratch a declared decode step of this shape needs in this process (0: the one-kernel walk
// runs and the scratch argument is not read); -1 for shapes the launcher refuses.
RL_EXPORT int64_t rl_attention_declared_decode_scratch(int64_t batch, int64_t heads, int64_t kv_heads, int64_t n_kv_blocks) {
    if (batch < 0 || heads < 0 || kv_heads <= 0 || heads % kv_heads || n_kv_blocks < 0) return -1;
    return decode_tc_scratch_bytes(batch, kv_heads, heads / kv_heads, n_kv_blocks);
}
