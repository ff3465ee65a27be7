// The kernels and launch templates of the cuda_bf16 backend's pipelined tensor-core tree GEMM (forms 1
// to 8 of rl_tree_gemm_form but 6, whose kernel is gemm_wide.cu's): tree_pipe_kernel (cp.async ring,
// ldmatrix + mma.sync; forms 1 and 2), tree_wgmma_kernel (the warpgroup MMA; form 3), tree_wgmma_ws_kernel
// (warp-specialised; form 4, with TMA copies 5, 7 and 8) and the hi / lo GEMM of linear_logp's tensor-core
// backward. Templates only, in an anonymous namespace: each gemm_pipe_*.cu file instantiates one family's
// kernels behind the entry points gemm.cuh declares, so the build compiles them in parallel (as one
// file, gemm_pipe.cu took 70 s of a 70 s cold build on an H100 host, 2026-12-07); gemm_pipe.cu picks
// the form. The kernels' code is the one file's, unchanged. gemm.cuh and gemm.cu's header describe the
// tree itself (leaves, steps, merges).
#pragma once
#include <cstdint>
#include <type_traits>

#include "common.cuh"
#include "gemm.cuh"
#include "gemm_tw.cuh"

using namespace rl;

namespace {

// ---------------------------------------------------------------------------------------------
// Pipelined tensor-core tree GEMM (tree_pipe_kernel, forms 1 and 2 of rl_tree_gemm_form)
// ---------------------------------------------------------------------------------------------
// tree_gemm_kernel's tree with the operands streamed through a ring of shared-memory slots by
// cp.async and multiplied with ldmatrix + mma.sync m16n8k16 (the HMMA instruction WMMA's 16x16x16
// BF16 tiles are made of; the tile GEMV uses it too). Per output element the steps, their order and
// the roundings are tree_gemm_kernel's: each leaf [lo, hi) accumulated in FP32 over 32-wide K steps
// from lo in increasing k (a step is two MMAs, k 0..15 then 16..31, zero-filled past hi), rounded
// once to BF16, merged bf16(fp32(l) + fp32(r)) as ((l0 + l1) + (l2 + l3)). The leaves follow one
// another through the same ring, so the copies of a leaf's first steps are in flight while the leaf
// before it finishes.
// Geometry (TpGeo): a BM x BN output tile per block of 8 warps (2 along M x 4 along N), each warp a
// (BM / 2) x (BN / 4) sub-tile of 16 x 8 accumulator fragments; STAGES ring slots; the rounded leaf
// sums a leaf must keep for a later merge held in registers (HELD_SMEM false) or in shared memory
// (true: each thread stores and reloads only its own values, so no barrier is needed).
//   form 1: 128 x 128, 4 slots, held in registers (64 x 32 per warp);
//   form 2: 128 x 256, 3 slots, held in shared memory (64 x 64 per warp: half the ldmatrix traffic
//           per MMA; 220 KB of shared memory), the fused bf16 tree only (the leaf-parallel leaves and
//           the FP32-output GEMM run form 1).
// Each operand is either K-contiguous (its slot holds R rows of 32 k, read by ldmatrix) or M- / N-
// contiguous (its slot holds 32 rows of R elements, read by ldmatrix.trans): A_MN / B_MN; both
// layouts hand the MMA the same fragments. Needs (tree_pipe_ok, host side): 16-byte aligned bases,
// the non-unit stride a multiple of 8 elements and, for a K-contiguous operand, leaf starts that are
// multiples of 8, so every 16-byte copy starts inside its row at an aligned address; a copy that
// crosses hi, M or N reads only the bytes before it and zero-fills the rest (cp.async's source size).
// Tiles run TP_GROUP_M tile rows at a time down the tile columns, so neighbouring blocks share B.
constexpr int TP_K = TB_K;
constexpr int TP_THREADS = 256;
constexpr int TP_LDK = TP_K + 8;  // K-contiguous slot rows: 40 elements (80 bytes: the 8 rows of an
                                  // ldmatrix matrix fall on distinct banks)

template <int BM_, int BN_, int STAGES_, bool HELD_SMEM_>
struct TpGeo {
    static constexpr int BM = BM_, BN = BN_, STAGES = STAGES_;
    static constexpr bool HELD_SMEM = HELD_SMEM_;
    static constexpr int MI = BM / 2 / 16;  // fragments per warp along M (16 rows each)
    static constexpr int NI = BN / 4 / 8;   // fragments per warp along N (8 columns each)
    static_assert(BM % 32 == 0 && BN % 32 == 0, "whole fragments per warp; B fragments loaded in pairs of k halves");
};
typedef TpGeo<128, 128, 4, false> TpForm1;
typedef TpGeo<128, 256, 3, true> TpForm2;

// One operand's slot: R rows (M or N) x 32 k.
template <bool MN, int R>
struct TpOperand {
    static constexpr int LD = MN ? R + 8 : TP_LDK;  // slot row stride (elements); R + 8: rows 16 bytes
                                                    // apart in banks, as for the K-contiguous rows
    static constexpr int ELEMS = MN ? TP_K * LD : R * LD;  // elements per slot
    static constexpr int CHUNKS = R * TP_K / 8;            // 16-byte copies per slot
    static constexpr int NCOPY = CHUNKS / TP_THREADS;      // per thread
    static_assert(CHUNKS % TP_THREADS == 0, "every thread copies the same number of chunks");
};

template <class G, bool A_MN, bool B_MN>
struct TpSmem {
    typedef TpOperand<A_MN, G::BM> OA;
    typedef TpOperand<B_MN, G::BN> OB;
    static constexpr int SLOT = OA::ELEMS + OB::ELEMS;
    static constexpr size_t RING = static_cast<size_t>(G::STAGES) * SLOT * sizeof(bf16);
    static constexpr size_t HELD = G::HELD_SMEM ? static_cast<size_t>(2) * G::BM * G::BN * sizeof(bf16) : 0;
    static constexpr size_t BYTES = RING + HELD;
    static_assert(RING % 16 == 0, "the held sums start 16-byte aligned");
};

// One thread's copies of one operand: chunk i is copy tid + TP_THREADS i of the slot.
template <bool MN, int R>
struct TpCopies {
    typedef TpOperand<MN, R> O;
    const bf16* src[O::NCOPY];  // the chunk's address at k = 0 (nullptr: row past the edge)
    int dst[O::NCOPY];          // its place in the slot (elements)
    int koff[O::NCOPY];         // K-contiguous: its first k in the step; MN: its k row
    int bytes[O::NCOPY];        // MN: bytes before the M / N edge (16 inside)

    // Operand rows r0 .. r0 + R - 1 (M or N) below r_lim, addressed as x[r * s_r + k * s_k].
    __device__ __forceinline__ void init(const bf16* x, int64_t s_r, int64_t s_k, int64_t r0, int64_t r_lim) {
#pragma unroll
        for (int i = 0; i < O::NCOPY; ++i) {
            const int c = static_cast<int>(threadIdx.x) + TP_THREADS * i;
            if (MN) {
                const int kr = c / (R / 8);
                const int rc = (c % (R / 8)) * 8;
                const int64_t left = r_lim - (r0 + rc);
                src[i] = left > 0 ? x + (r0 + rc) + kr * s_k : nullptr;
                bytes[i] = left >= 8 ? 16 : (left > 0 ? static_cast<int>(2 * left) : 0);
                dst[i] = kr * O::LD + rc;
                koff[i] = kr;
            } else {
                const int r = c / (TP_K / 8);
                const int kc = (c % (TP_K / 8)) * 8;
                src[i] = r0 + r < r_lim ? x + (r0 + r) * s_r + kc : nullptr;
                bytes[i] = 16;
                dst[i] = r * O::LD + kc;
                koff[i] = kc;
            }
        }
    }

    // The copies of the 32-wide step at k0 of a leaf ending at hi into slot (elements at slot), from
    // the operand part `part` elements on (the lo part of a hi / lo pair; else 0).
    __device__ __forceinline__ void issue(bf16* slot, int64_t k0, int64_t hi, int64_t s_k, const bf16* dummy,
                                          int64_t part = 0) const {
#pragma unroll
        for (int i = 0; i < O::NCOPY; ++i) {
            const int64_t k = k0 + koff[i];
            int n = 0;
            const bf16* p = dummy;
            if (src[i] != nullptr && k < hi) {
                if (MN) {
                    n = bytes[i];
                    p = src[i] + k0 * s_k + part;
                } else {
                    n = hi - k >= 8 ? 16 : static_cast<int>(2 * (hi - k));
                    p = src[i] + k0 + part;
                }
            }
            cp_async16(slot + dst[i], p, n);
        }
    }
};

// The rounded leaf sums a block keeps for later merges: two sets (h0: l0, then l0 + l1, then the
// result; h1: l2, then l2 + l3) of this thread's MI x NI x 2 packed pairs, in registers or in this
// thread's own places of shared memory (word (set, pair) of lane l at [set][pair][warp][lane]:
// consecutive lanes, consecutive banks).
template <class G>
struct TpHeld {
    static constexpr int PAIRS = G::MI * G::NI * 2;
    uint32_t reg[G::HELD_SMEM ? 1 : 2][G::HELD_SMEM ? 1 : PAIRS];
    uint32_t* mem;

    __device__ __forceinline__ void init(unsigned char* base) {
        mem = reinterpret_cast<uint32_t*>(base) + threadIdx.x;
    }
    __device__ __forceinline__ uint32_t get(int set, int q) const {
        if (G::HELD_SMEM) return mem[(set * PAIRS + q) * TP_THREADS];
        return reg[G::HELD_SMEM ? 0 : set][G::HELD_SMEM ? 0 : q];
    }
    __device__ __forceinline__ void put(int set, int q, uint32_t v) {
        if (G::HELD_SMEM) mem[(set * PAIRS + q) * TP_THREADS] = v;
        else reg[G::HELD_SMEM ? 0 : set][G::HELD_SMEM ? 0 : q] = v;
    }
};

// DEPTH: the tree (2^DEPTH leaves, merged in the block); LEAVES: one leaf per blockIdx.z instead,
// rounded to BF16 and stored at out + leaf M N (the leaf-parallel form's workspace; DEPTH 0);
// OUT_F32: the FP32 sums themselves (DEPTH 0). pairs: the host found two neighbouring columns one
// 4-byte (BF16) or 8-byte (FP32) aligned store apart.
// HILO (DEPTH 0, rl_gemm_hilo): A is a pair of BF16 parts of one FP32 operand, g.a (hi) and a_lo (lo,
// same strides), and one FP32 accumulator runs over K in blocks of HILO_BLOCK: the block's hi part
// (two 32-wide steps), then its lo part against the same B rows, zero-filled past K; it starts from
// acc_in [M, N] (row stride s_acc) when given, else from 0, and is stored as FP32 or rounded once.
constexpr int HILO_BLOCK = 64;
template <class G, int DEPTH, bool OUT_F32, bool LEAVES, bool A_MN, bool B_MN, bool HILO = false>
__global__ void __launch_bounds__(TP_THREADS, 1)
    tree_pipe_kernel(TreeArgs g, void* out, int64_t s_om, int64_t s_on, int pairs, const bf16* a_lo,
                     const float* acc_in, int64_t s_acc) {
    static_assert(!(OUT_F32 || LEAVES || HILO) || DEPTH == 0, "FP32 output, the leaf workspace and hi / lo are single leaves");
    static_assert(!(HILO && LEAVES), "hi / lo products have no leaf workspace");
    static_assert(HILO_BLOCK == 2 * TP_K, "a hi / lo block is two steps of each part");
    typedef TpSmem<G, A_MN, B_MN> S;
    constexpr int NL = 1 << DEPTH;
    constexpr int MI = G::MI, NI = G::NI;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* ring = reinterpret_cast<bf16*>(smem_raw);
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int wm = warp / 4;
    const int wn = warp % 4;

    // Grouped tile order.
    const int64_t tiles_m = cdiv(g.M, G::BM);
    const int64_t tiles_n = cdiv(g.N, G::BN);
    const int64_t pid = blockIdx.x;
    const int64_t group = static_cast<int64_t>(TP_GROUP_M) * tiles_n;
    const int64_t first_m = (pid / group) * TP_GROUP_M;
    const int64_t rows_here = tiles_m - first_m < TP_GROUP_M ? tiles_m - first_m : TP_GROUP_M;
    const int64_t m0 = (first_m + (pid % group) % rows_here) * G::BM;
    const int64_t n0 = ((pid % group) / rows_here) * G::BN;
    const int first = LEAVES ? static_cast<int>(blockIdx.z) : 0;

    TpCopies<A_MN, G::BM> ca;
    TpCopies<B_MN, G::BN> cb;
    ca.init(g.a, g.s_am, g.s_ak, m0, g.M);
    cb.init(g.b, g.s_bn, g.s_bk, n0, g.N);

    // The copy cursor: leaf lf, step at k0 (lf == first + NL: every step issued). hi / lo: step `issued`
    // of hilo_steps is part (issued >> 1) & 1 of block issued >> 2, its half issued & 1.
    int lf = first;
    int64_t k0 = tp_bound(g, first);
    auto skip_empty = [&]() {
        while (lf < first + NL && k0 >= tp_bound(g, lf + 1)) {
            ++lf;
            if (lf < first + NL) k0 = tp_bound(g, lf);
        }
    };
    if (!HILO) skip_empty();
    const int64_t hilo_steps = HILO ? 4 * cdiv(g.K, static_cast<int64_t>(HILO_BLOCK)) : 0;
    const int64_t lo_part = HILO ? a_lo - g.a : 0;
    int64_t issued = 0;
    auto issue_next = [&]() {
        if (HILO) {
            if (issued < hilo_steps) {
                bf16* slot = ring + (issued % G::STAGES) * S::SLOT;
                const int64_t kk = (issued >> 2) * HILO_BLOCK + (issued & 1) * TP_K;
                ca.issue(slot, kk, g.K, g.s_ak, g.a, ((issued >> 1) & 1) ? lo_part : 0);
                cb.issue(slot + S::OA::ELEMS, kk, g.K, g.s_bk, g.a);
            }
        } else if (lf < first + NL) {
            bf16* slot = ring + (issued % G::STAGES) * S::SLOT;
            const int64_t hi = tp_bound(g, lf + 1);
            ca.issue(slot, k0, hi, g.s_ak, g.a);
            cb.issue(slot + S::OA::ELEMS, k0, hi, g.s_bk, g.a);
            k0 += TP_K;
            skip_empty();
        }
        cp_async_commit();
        ++issued;
    };
#pragma unroll
    for (int s = 0; s < G::STAGES - 1; ++s) issue_next();

    // ldmatrix row addresses (elements from the operand's slot base, without the step's k or slot).
    // A, K-contiguous: lanes 0..15 rows 0..15 at k 0, lanes 16..31 the same rows at k 8 (+16 for the
    // second MMA). A, M-contiguous: lane 8q + r, k row 8 (q >> 1) + r, columns 8 (q & 1) on (+16 rows).
    // B, K-contiguous: lane 8q + r, column row r of the fragment at k 8q (one x4: both MMAs' halves).
    // B, N-contiguous: lane l, k row l, the fragment's 8 columns.
    constexpr int LDA = S::OA::LD, LDB = S::OB::LD;
    const int a_off = A_MN ? ((lane >> 4) * 8 + (lane & 7)) * LDA + wm * (16 * MI) + ((lane >> 3) & 1) * 8
                           : (wm * (16 * MI) + (lane & 15)) * LDA + (lane >> 4) * 8;
    const int b_off = B_MN ? lane * LDB + wn * (8 * NI) : (wn * (8 * NI) + (lane & 7)) * LDB + (lane >> 3) * 8;
    constexpr int A_FRAG = A_MN ? 16 : 16 * LDA;  // to the next 16 rows
    constexpr int A_HALF = A_MN ? 16 * LDA : 16;  // to k 16
    constexpr int B_FRAG = B_MN ? 8 : 8 * LDB;    // to the next 8 columns

    float acc[MI][NI][4];
    TpHeld<G> held;
    held.init(smem_raw + S::RING);
    int64_t step = 0;
#pragma unroll
    for (int l = 0; l < NL; ++l) {
        const int leaf = first + l;
        const int64_t steps =
            HILO ? hilo_steps : cdiv(tp_bound(g, leaf + 1) - tp_bound(g, leaf), static_cast<int64_t>(TP_K));
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < NI; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float v = 0.0f;
                    if (HILO && acc_in != nullptr) {
                        const int64_t r = m0 + wm * (16 * MI) + 16 * i + (lane >> 2) + 8 * (e >> 1);
                        const int64_t c = n0 + wn * (8 * NI) + 8 * j + 2 * (lane & 3) + (e & 1);
                        if (r < g.M && c < g.N) v = acc_in[r * s_acc + c];
                    }
                    acc[i][j][e] = v;
                }
        for (int64_t s = 0; s < steps; ++s, ++step) {
            cp_async_wait<G::STAGES - 2>();
            __syncthreads();  // this step's slot has landed for every thread; the last one's is free
            issue_next();
            const bf16* sa = ring + (step % G::STAGES) * S::SLOT;
            const bf16* sb = sa + S::OA::ELEMS;
            uint32_t bq[NI][4];
#pragma unroll
            for (int j = 0; j < NI; ++j) {
                if (B_MN) ldsm_x4_t(bq[j], sb + b_off + j * B_FRAG);
                else ldsm_x4(bq[j], sb + b_off + j * B_FRAG);
            }
#pragma unroll
            for (int c = 0; c < 2; ++c) {  // k 0..15, then 16..31
                uint32_t a[MI][4];
#pragma unroll
                for (int i = 0; i < MI; ++i) {
                    if (A_MN) ldsm_x4_t(a[i], sa + a_off + i * A_FRAG + c * A_HALF);
                    else ldsm_x4(a[i], sa + a_off + i * A_FRAG + c * A_HALF);
                }
#pragma unroll
                for (int j = 0; j < NI; ++j) {
                    const uint32_t b[2] = {bq[j][2 * c], bq[j][2 * c + 1]};
#pragma unroll
                    for (int i = 0; i < MI; ++i) mma_bf16_16816(acc[i][j], a[i], b);
                }
            }
        }
        if (!OUT_F32) {
            // l0 into h0; l0 + l1 into h0; l2 into h1; l2 + l3 into h1, then (l0 + l1) + (l2 + l3) into h0.
            const int set = l < 2 ? 0 : 1;
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j)
#pragma unroll
                    for (int p = 0; p < 2; ++p) {
                        const int q = (i * NI + j) * 2 + p;
                        uint32_t v = tp_round2(acc[i][j][2 * p], acc[i][j][2 * p + 1]);
                        if (l & 1) v = tp_merge2(held.get(set, q), v);
                        if (l == 3) v = tp_merge2(held.get(0, q), v);
                        held.put(l == 3 ? 0 : set, q, v);
                    }
        }
    }
    cp_async_wait<0>();

    const int gq = lane >> 2;
    const int t = lane & 3;
    const int64_t leaf_off = LEAVES ? static_cast<int64_t>(first) * g.M * g.N : 0;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int p = 0; p < 2; ++p) {
                const int64_t r = m0 + wm * (16 * MI) + 16 * i + gq + 8 * p;
                const int64_t c = n0 + wn * (8 * NI) + 8 * j + 2 * t;
                if (r >= g.M || c >= g.N) continue;
                const int64_t off = leaf_off + r * s_om + c * s_on;
                const bool two = c + 1 < g.N;
                if (OUT_F32) {
                    float* o = static_cast<float*>(out) + off;
                    if (two && pairs) {
                        *reinterpret_cast<float2*>(o) = make_float2(acc[i][j][2 * p], acc[i][j][2 * p + 1]);
                    } else {
                        o[0] = acc[i][j][2 * p];
                        if (two) o[s_on] = acc[i][j][2 * p + 1];
                    }
                } else {
                    const uint32_t v = held.get(0, (i * NI + j) * 2 + p);
                    bf16* o = static_cast<bf16*>(out) + off;
                    if (two && pairs) {
                        *reinterpret_cast<uint32_t*>(o) = v;
                    } else {
                        o[0] = tp_lo(v);
                        if (two) o[s_on] = tp_hi(v);
                    }
                }
            }
}



template <class G, int DEPTH, bool OUT_F32, bool LEAVES, bool A_MN, bool B_MN>
int launch_tree_pipe_as(const TreeArgs& g, int z, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    auto kernel = tree_pipe_kernel<G, DEPTH, OUT_F32, LEAVES, A_MN, B_MN>;
    constexpr size_t smem = TpSmem<G, A_MN, B_MN>::BYTES;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, G::BM) * cdiv(g.N, G::BN);
    const int pairs = tp_pairs(out, s_om, s_on, OUT_F32);
    dim3 grid(static_cast<unsigned>(tiles), 1, static_cast<unsigned>(z));
    kernel<<<grid, TP_THREADS, smem, st>>>(g, out, s_om, s_on, pairs, nullptr, nullptr, 0);
    return launch_status();
}

template <class G, int DEPTH, bool OUT_F32, bool LEAVES>
int launch_tree_pipe(const TreeArgs& g, int z, void* out, int64_t s_om, int64_t s_on, cudaStream_t st) {
    const bool a_mn = g.s_ak != 1;
    const bool b_mn = g.s_bk != 1;
    if (a_mn) {
        return b_mn ? launch_tree_pipe_as<G, DEPTH, OUT_F32, LEAVES, true, true>(g, z, out, s_om, s_on, st)
                    : launch_tree_pipe_as<G, DEPTH, OUT_F32, LEAVES, true, false>(g, z, out, s_om, s_on, st);
    }
    return b_mn ? launch_tree_pipe_as<G, DEPTH, OUT_F32, LEAVES, false, true>(g, z, out, s_om, s_on, st)
                : launch_tree_pipe_as<G, DEPTH, OUT_F32, LEAVES, false, false>(g, z, out, s_om, s_on, st);
}

template <bool OUT_F32, bool A_MN, bool B_MN>
int launch_hilo_as(const TreeArgs& g, const bf16* lo, const float* acc_in, int64_t s_acc, cudaStream_t st) {
    auto kernel = tree_pipe_kernel<TpForm1, 0, OUT_F32, false, A_MN, B_MN, true>;
    constexpr size_t smem = TpSmem<TpForm1, A_MN, B_MN>::BYTES;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, TpForm1::BM) * cdiv(g.N, TpForm1::BN);
    const int pairs = tp_pairs(g.c, g.s_cm, g.s_cn, OUT_F32);
    kernel<<<static_cast<unsigned>(tiles), TP_THREADS, smem, st>>>(g, g.c, g.s_cm, g.s_cn, pairs, lo, acc_in, s_acc);
    return launch_status();
}

// Warpgroup form of the fused tree (tree_wgmma_kernel, form 3 of rl_tree_gemm_form; the host emulation
// runs it through its own descriptor decoder, tests/cuda_emu/emu.h):
// tree_pipe_kernel's leaves and merges with the Hopper warpgroup MMA. A block of two warpgroups owns a
// 128 x 128 output tile, warpgroup w rows 64 w .. 64 w + 63, and multiplies with wgmma.mma_async
// m64n128k16 from the 128-byte-swizzle K-major ring slots of gemv_wgmma_kernel (64 k of 128 A rows and
// 128 B rows per slot, 32 KB; TW_STAGES slots: TW_AHEAD loading, one multiplied, one whose MMAs may still
// run, so one block barrier per slot). The K loop of each leaf is the fused kernel's: 32-wide
// steps from the leaf's first index in increasing k, each two k16 products, zero-filled past the leaf's
// end (a slot's second step is left out when the leaf ends inside its first), one FP32 accumulator per
// output element that takes one k16 product per instruction in increasing k, as the HMMA of mma.sync
// does (the warpgroup GEMV's bits equal the WMMA kernel's on the H200). At a leaf's end the warpgroup
// waits for its MMAs, rounds the leaf to BF16 and merges it as tree_pipe_kernel does (held sums in
// registers). Operands: K-contiguous (the forward's x @ w^T, the FP32 logits: a slot holds 128 rows of
// 128 bytes, K-major) or M- / N-contiguous (the backward's dy @ w and x^T @ dy: a slot holds two
// 64-element-wide swizzle atoms of 64 k rows, MN-major, read with the instruction's transpose flag;
// the descriptor's leading byte offset is the stride between the two atoms, its stride byte offset
// the 1024 bytes between groups of 8 k rows, a k16 product 2048 bytes on): A_MN / B_MN, the
// combinations (K, K), (K, MN) and (MN, MN). Needs 16-byte aligned data, the non-unit stride a multiple
// of 8 and, with a K-contiguous operand, every leaf bound a multiple of 8 (tree_wgmma_ok); other
// products run form 1.
constexpr int TW_AHEAD = 3;               // slots whose copies are in flight ahead of the MMAs
constexpr int TW_STAGES = TW_AHEAD + 2;   // + the slot being multiplied + the one whose MMAs may still run
constexpr int TW_THREADS = 256;

// One thread's four 16-byte copies of one operand per slot (1024 per operand: 256 threads x 4).
// K-major (MN false): rows r0 + 32 i (r0 = tid / 8) of the tile's 128 rows, chunk kc = tid % 8 of the
// slot's 64 k, at row r, chunk kc ^ (r % 8) (the 128-byte swizzle). MN-major: k rows r0 + 32 (i & 1)
// of the slot, chunk j = tid % 8 of atom i / 2 (elements 64 (i / 2) + 8 j .. + 7 of the tile's rows),
// at atom (i / 2), row r, chunk j ^ (r % 8).
template <bool MN>
struct TwCopies {
    const bf16* src[4];  // the chunk's address at k = 0 (nullptr: past M / N)
    int bytes[4];        // MN-major: bytes before the M / N edge
    uint32_t dst[4];     // offset in the operand's part of the slot
    int krow[4];         // K-major: the chunk's first k in the slot; MN-major: its k row

    // t: the thread's index among the 256 copy threads of a slot (tree_wgmma_kernel: threadIdx.x; the
    // warp-specialised kernel's 128 copy threads take two indices each).
    __device__ __forceinline__ void init(const bf16* x, int64_t s_r, int64_t s_k, int64_t row0, int64_t lim, int t) {
        const int r0 = t >> 3;
        const int c = t & 7;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if (MN) {
                const int atom = i >> 1;
                const int r = r0 + 32 * (i & 1);
                const int64_t left = lim - (row0 + 64 * atom + 8 * c);
                src[i] = left > 0 ? x + row0 + 64 * atom + 8 * c + r * s_k : nullptr;
                bytes[i] = left >= 8 ? 16 : (left > 0 ? static_cast<int>(2 * left) : 0);
                dst[i] = atom * 8192 + r * 128 + ((c ^ (r & 7)) << 4);
                krow[i] = r;
            } else {
                const int r = r0 + 32 * i;
                src[i] = row0 + r < lim ? x + (row0 + r) * s_r + 8 * c : nullptr;
                bytes[i] = 16;
                dst[i] = r * 128 + ((c ^ (r & 7)) << 4);
                krow[i] = 8 * c;
            }
        }
    }

    // The copies of the slot at k0 of a leaf ending at hi (K-major: bounds are multiples of 8), from the
    // operand part `part` elements on (the lo part of a hi / lo pair; else 0).
    __device__ __forceinline__ void issue(uint32_t base, int64_t k0, int64_t hi, int64_t s_k, const bf16* dummy,
                                          int64_t part = 0) const {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const bool ok = src[i] != nullptr && k0 + krow[i] < hi;
            const bf16* p = dummy;
            if (ok) p = (MN ? src[i] + k0 * s_k : src[i] + k0) + part;
            cp_async16_s(base + dst[i], p, ok ? bytes[i] : 0);
        }
    }
};



// The accumulators' start: acc_in (HILO, when given) at the thread's fragment places of a warpgroup tile
// whose warp rows start at row0 (d[e]: row row0 + g (+ 8), column n0 + 8 (e / 4) + 2 t (+ 1)), else 0.
template <bool HILO>
__device__ __forceinline__ void tw_acc_start(float (&acc)[64], const TreeArgs& g, const float* acc_in, int64_t s_acc,
                                             int64_t row0, int64_t n0) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < 64; ++e) {
        float v = 0.0f;
        if (HILO && acc_in != nullptr) {
            const int64_t r = row0 + (lane >> 2) + 8 * ((e >> 1) & 1);
            const int64_t c = n0 + 8 * (e >> 2) + 2 * (lane & 3) + (e & 1);
            if (r < g.M && c < g.N) v = acc_in[r * s_acc + c];
        }
        acc[e] = v;
    }
}


// Leaf l (0 .. 3) of a fused tree, rounded to BF16 and held for the merges ((l0 + l1) + (l2 + l3)):
// h0 takes l0, then l0 + l1, then the result; h1 takes l2 (tree_pipe_kernel's merges, in pairs).
__device__ __forceinline__ void tw_hold(int l, const float (&acc)[64], uint32_t (&h0)[32], uint32_t (&h1)[32]) {
#pragma unroll
    for (int q = 0; q < 32; ++q) {
        uint32_t v = tp_round2(acc[2 * q], acc[2 * q + 1]);
        if (l == 0) {
            h0[q] = v;
        } else if (l == 1) {
            h0[q] = tp_merge2(h0[q], v);
        } else if (l == 2) {
            h1[q] = v;
        } else {
            h0[q] = tp_merge2(h0[q], tp_merge2(h1[q], v));
        }
    }
}

// Sibling leaves 2p and 2p + 1 of a depth-2 fused tree (form 7), summed side by side in acc0 and acc1:
// each rounded to BF16 and the two merged; for p = 2 that sum is then merged into h0 (l0 + l1). The
// same roundings and merges as tw_hold over leaves 0 .. 3 (a merge is one FP32 addition, so the order of
// its two operands does not matter).
__device__ __forceinline__ void tw_hold_pair(int p, const float (&acc0)[64], const float (&acc1)[64], uint32_t (&h0)[32]) {
#pragma unroll
    for (int q = 0; q < 32; ++q) {
        const uint32_t v = tp_merge2(tp_round2(acc0[2 * q], acc0[2 * q + 1]), tp_round2(acc1[2 * q], acc1[2 * q + 1]));
        h0[q] = p == 0 ? v : tp_merge2(h0[q], v);
    }
}

// Leaf L (0 .. 3) of a depth-2 fused tree in form 8: tw_hold's rounding and merges with h1 (leaf 2, rounded)
// parked in shared memory at park[256 q] (this thread's words only: no barrier); leaf 3 leaves the tile's
// merged tree there too, in leaf 2's places (for tw_store_parked).
template <int L>
__device__ __forceinline__ void tw_roll_hold(const float (&acc)[64], uint32_t (&h0)[32], uint32_t* park) {
#pragma unroll
    for (int q = 0; q < 32; ++q) {
        const uint32_t v = tp_round2(acc[2 * q], acc[2 * q + 1]);
        if (L == 0) {
            h0[q] = v;
        } else if (L == 1) {
            h0[q] = tp_merge2(h0[q], v);
        } else if (L == 2) {
            park[256 * q] = v;
        } else {
            park[256 * q] = tp_merge2(h0[q], tp_merge2(park[256 * q], v));
        }
    }
}

// tw_store's BF16 stores (no leaf workspace) of the merged tree parked at park[256 q] by tw_roll_hold<3>: the
// same places and values; a loop over the pairs that ptxas need not unroll, so the stores' addresses are not
// all live at once beside the next tile's accumulator (form 8 stores while that tile's first MMAs run).
__device__ __forceinline__ void tw_store_parked(const TreeArgs& g, const uint32_t* park, int64_t row0, int64_t n0,
                                                int pairs) {
    const int lane = threadIdx.x & 31;
    const int gq = lane >> 2;
    const int t = lane & 3;
#pragma unroll 4
    for (int q = 0; q < 32; ++q) {
        const int64_t r = row0 + gq + 8 * (q & 1);
        const int64_t c = n0 + 8 * (q >> 1) + 2 * t;
        if (r >= g.M || c >= g.N) continue;
        const uint32_t v = park[256 * q];
        bf16* o = static_cast<bf16*>(g.c) + r * g.s_cm + c * g.s_cn;
        const bool two = c + 1 < g.N;
        if (two && pairs) {
            *reinterpret_cast<uint32_t*>(o) = v;
        } else {
            o[0] = tp_lo(v);
            if (two) o[g.s_cn] = tp_hi(v);
        }
    }
}

// The store of one warp's 16 rows x 128 columns of a warpgroup tile (row0: the warp's first row, n0 the
// tile's first column): the FP32 sums (OUT_F32) or the merged BF16 tree h0, to g.c (LEAVES: leaf
// `first`'s [M, N] slice of the workspace); pairs: whether two neighbouring columns may be stored as one.
template <bool OUT_F32, bool LEAVES>
__device__ __forceinline__ void tw_store(const TreeArgs& g, const float (&acc)[64], const uint32_t (&h0)[32],
                                         int64_t row0, int64_t n0, int first, int pairs) {
    const int lane = threadIdx.x & 31;
    const int gq = lane >> 2;
    const int t = lane & 3;
    const int64_t leaf_off = LEAVES ? static_cast<int64_t>(first) * g.M * g.N : 0;
#pragma unroll
    for (int j = 0; j < TW_BN / 8; ++j)
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const int q = 2 * j + p;  // acc[2 q], acc[2 q + 1] = d[4 j + 2 p], d[4 j + 2 p + 1]
            const int64_t r = row0 + gq + 8 * p;
            const int64_t c = n0 + 8 * j + 2 * t;
            if (r >= g.M || c >= g.N) continue;
            const int64_t off = r * g.s_cm + c * g.s_cn + leaf_off;
            const bool two = c + 1 < g.N;
            if (OUT_F32) {
                float* o = static_cast<float*>(g.c) + off;
                if (two && pairs) {
                    *reinterpret_cast<float2*>(o) = make_float2(acc[2 * q], acc[2 * q + 1]);
                } else {
                    o[0] = acc[2 * q];
                    if (two) o[g.s_cn] = acc[2 * q + 1];
                }
            } else {
                bf16* o = static_cast<bf16*>(g.c) + off;
                if (two && pairs) {
                    *reinterpret_cast<uint32_t*>(o) = h0[q];
                } else {
                    o[0] = tp_lo(h0[q]);
                    if (two) o[g.s_cn] = tp_hi(h0[q]);
                }
            }
        }
}

// SwiGLU of one neighbouring pair: y = g / (1 + exp(-g)) * u in FP32, rounded once (swiglu_fwd_kernel's
// expression, elementwise.cu).
__device__ __forceinline__ bf16 tw_swiglu1(bf16 gb, bf16 ub) {
    const float g = f32(gb);
    return to_bf16(g / (1.0f + expf(-g)) * f32(ub));
}

// tw_store's places for the SWIGLU kernel (g.N = F columns of y = g.c): swiglu of the gate tile's merged
// tree (pair q at hg[256 q], parked in shared memory by this thread) and the up tile's h0, pair by pair.
__device__ __forceinline__ void tw_store_swiglu(const TreeArgs& g, const uint32_t* hg, const uint32_t (&h0)[32],
                                                int64_t row0, int64_t n0, int pairs) {
    tw_for_pairs<TW_BN>(g, row0, n0, [&](int q, int64_t r, int64_t c) {
        bf16* o = static_cast<bf16*>(g.c) + r * g.s_cm + c * g.s_cn;
        const uint32_t gate = hg[256 * q];
        const bf16 lo = tw_swiglu1(tp_lo(gate), tp_lo(h0[q]));
        const bf16 hi = tw_swiglu1(tp_hi(gate), tp_hi(h0[q]));
        if (c + 1 < g.N && pairs) {
            *reinterpret_cast<uint32_t*>(o) = tp_pack(lo, hi);
        } else {
            o[0] = lo;
            if (c + 1 < g.N) o[g.s_cn] = hi;
        }
    });
}

// HILO (DEPTH 0): the hi / lo GEMM of rl_gemm_hilo (tree_pipe_kernel's HILO) with the warpgroup MMA:
// slot s holds 64 k of part s % 2 (hi, then lo at a_lo) of block s / 2, all four k16 products issued
// (zero-filled past K), one accumulator from acc_in (or 0) over every slot.
// LEAVES (DEPTH 0): the leaf-parallel form's leaves, leaf blockIdx.z of the tree's bounds into the
// BF16 workspace g.c (leaf z at z * M * N, row stride g.s_cm, unit column stride).
template <int DEPTH, bool OUT_F32, bool A_MN, bool B_MN, bool HILO = false, bool LEAVES = false>
__global__ void __launch_bounds__(TW_THREADS, 1)
    tree_wgmma_kernel(TreeArgs g, int pairs, const bf16* a_lo, const float* acc_in, int64_t s_acc) {
    static_assert(!(OUT_F32 || HILO || LEAVES) || DEPTH == 0, "FP32 output, hi / lo and the leaf workspace are single leaves");
    static_assert(!(HILO && LEAVES), "hi / lo products have no leaf workspace");
    constexpr int NL = 1 << DEPTH;
    const int first = LEAVES ? static_cast<int>(blockIdx.z) : 0;  // the block's first leaf
    extern __shared__ __align__(1024) unsigned char smem_raw[];  // the swizzle needs 1024-byte slots
    const int tid = threadIdx.x;
    const int wg = tid >> 7;            // warpgroup: rows 64 wg .. 64 wg + 63 of the tile
    const int warp = (tid >> 5) & 3;    // warp in the warpgroup: 16 of those rows
    const int lane = tid & 31;

    int64_t m0, n0;
    tw_tile(g, blockIdx.x, m0, n0);

    const uint32_t ring = smem_u32(smem_raw);
    if (ring & 1023u) __trap();  // dynamic shared memory starts 1024-byte aligned
    TwCopies<A_MN> ca;
    TwCopies<B_MN> cb;
    ca.init(g.a, g.s_am, g.s_ak, m0, g.M, tid);
    cb.init(g.b, g.s_bn, g.s_bk, n0, g.N, tid);

    // The copy cursor: leaf lf, slot at k0 (64 k); lf == first + NL: every slot issued.
    int lf = first;
    int64_t k0 = tp_bound(g, first);
    auto skip_empty = [&]() {
        while (lf < first + NL && k0 >= tp_bound(g, lf + 1)) {
            ++lf;
            if (lf < first + NL) k0 = tp_bound(g, lf);
        }
    };
    if (!HILO) skip_empty();
    const int64_t hilo_slots = HILO ? 2 * cdiv(g.K, static_cast<int64_t>(HILO_BLOCK)) : 0;
    const int64_t lo_part = HILO ? a_lo - g.a : 0;
    int issued = 0;
    auto issue_next = [&]() {
        const uint32_t d = ring + (issued % TW_STAGES) * TW_SLOT;
        if (HILO) {
            if (issued < hilo_slots) {
                const int64_t kk = (issued >> 1) * HILO_BLOCK;
                ca.issue(d, kk, g.K, g.s_ak, g.a, (issued & 1) ? lo_part : 0);
                cb.issue(d + TW_HALF, kk, g.K, g.s_bk, g.a);
            }
        } else if (lf < first + NL) {
            const int64_t hi = tp_bound(g, lf + 1);
            ca.issue(d, k0, hi, g.s_ak, g.a);
            cb.issue(d + TW_HALF, k0, hi, g.s_bk, g.a);
            k0 += TW_SK;
            skip_empty();
        }
        cp_async_commit();
        ++issued;
    };
#pragma unroll
    for (int s = 0; s < TW_AHEAD; ++s) issue_next();

    // This warpgroup's 64 A rows (K-major: 64 rows of 128 bytes; MN-major: atom wg), all 128 B rows; a
    // k16 product starts 32 bytes (K-major) or 16 k rows = 2048 bytes (MN-major) further on.
    const uint64_t desc0 = A_MN ? wg_desc_sw128_mn(ring + wg * 8192, 8192) : wg_desc_sw128(ring + wg * (64 * 128));
    const uint64_t descb0 = B_MN ? wg_desc_sw128_mn(ring + TW_HALF, 8192) : wg_desc_sw128(ring + TW_HALF);
    float acc[64];
    uint32_t h0[32], h1[32];
    int consumed = 0;
#pragma unroll
    for (int l = 0; l < NL; ++l) {
        const int64_t width = tp_bound(g, first + l + 1) - tp_bound(g, first + l);
        const int64_t steps = HILO ? 2 * hilo_slots : cdiv(width, static_cast<int64_t>(TB_K));
        const int64_t slots = HILO ? hilo_slots : cdiv(width, static_cast<int64_t>(TW_SK));
        tw_acc_start<HILO>(acc, g, acc_in, s_acc, m0 + 64 * wg + 16 * warp, n0);
        for (int64_t i = 0; i < slots; ++i, ++consumed) {
            cp_async_wait<TW_AHEAD - 1>();
            __syncthreads();      // this slot has landed for every thread, and every warpgroup has passed
                                  // the previous slot's wg_wait1, so the MMAs of the slot before that are done
            issue_next();         // ... and its ring place takes the slot TW_AHEAD on
            fence_proxy_async();  // this slot is visible to the warpgroup MMA's reads
            const uint64_t off = static_cast<uint64_t>(((consumed % TW_STAGES) * TW_SLOT) >> 4);
            const uint64_t da = desc0 + off;
            const uint64_t db = descb0 + off;
            tw_slot_mmas<A_MN, B_MN>(acc, da, db, i, steps);
        }
        wg_wait0();  // the leaf's sums are in acc
        if (!OUT_F32) tw_hold(l, acc, h0, h1);
    }
    cp_async_wait<0>();
    tw_store<OUT_F32, LEAVES>(g, acc, h0, m0 + 64 * wg + 16 * warp, n0, first, pairs);
}

// Warp-specialised form of tree_wgmma_kernel (form 4 of rl_tree_gemm_form; the fused tree, the
// leaf-parallel leaves, the FP32 logits and the hi / lo products): the same tiles, slots, copies,
// k16 products in the same order, leaf rounding, merges and stores, so the same bits; what changes is
// who waits for what. Warpgroup 0 only copies: its 128 threads issue a slot's 2048 16-byte copies
// (TwCopies with two copy indices each) into ring place j % TWS_STAGES once that place is empty, and
// the place's `full` barrier completes when every copy of the slot has landed (cp.async.mbarrier.arrive).
// Warpgroups 1 and 2 only multiply (rows 0 .. 63 and 64 .. 127 of the tile): wait for `full`, issue
// the slot's MMAs, and once wgmma.wait_group says the MMAs of the slot before have read their operands,
// arrive on that slot's `empty` barrier (one arrival per warpgroup), which lets the copies of the slot
// TWS_STAGES on start. No block barrier after the barriers' set-up, and no copy instructions between
// a warpgroup's MMAs (ncu of form 3: 240 instructions per warp and slot, a block barrier per slot,
// 0.45 eligible warps per scheduler, the tensor pipe 34 % busy).
constexpr int TWS_STAGES = 6;     // ring places (6 x 32 KB)
constexpr int TWS_THREADS = 384;  // the copy warpgroup, then the two MMA warpgroups
constexpr int TWS_SMEM = TWS_STAGES * TW_SLOT + 2 * TWS_STAGES * 8;  // the ring, then full[], empty[]
// SWIGLU: then, 128-byte aligned, the gate tile's merged tree parked while the up tile runs (32 packed
// pairs per MMA thread, word q of thread i at q * 256 + i: no bank conflicts); in registers it spilled
// 268 bytes per thread (ptxas -v).
constexpr int TWS_PARK = (TWS_SMEM + 127) / 128 * 128;
constexpr int TWS_SMEM_SWIGLU = TWS_PARK + 32 * 256 * 4;
// Registers per thread after the split (setmaxnreg): the launch allocates 168 per thread (ptxas's count
// under __launch_bounds__(384, 1)); the copy warpgroup gives some back so that the MMA warpgroups hold a
// DEPTH-2 tile's sums (64 FP32 and 2 x 32 packed BF16 pairs) and the tile loop's state (ptxas -v, nvcc
// 13.0, DEPTH 2: 4 bytes spilled at 72 / 216, 36 at 88 / 208, 68 at 104 / 200). An increase waits for
// registers the block has, so 128 x 72 + 256 x 216 must not exceed 384 x 168.
constexpr int TWS_COPY_REGS = 72;
constexpr int TWS_MMA_REGS = 216;
static_assert(128 * TWS_COPY_REGS + 256 * TWS_MMA_REGS <= TWS_THREADS * 168, "setmaxnreg beyond the launch's registers");
// Form 8 (ROLL) holds two accumulators and the merged sums while a leaf's MMAs are in flight: at 72 / 216 ptxas
// spilled 812 bytes per thread, at 40 / 232 8 bytes (ptxas -v, nvcc 13.0); its copy warpgroup is one TMA thread.
constexpr int TWS_ROLL_COPY_REGS = 40;
constexpr int TWS_ROLL_MMA_REGS = 232;
static_assert(128 * TWS_ROLL_COPY_REGS + 256 * TWS_ROLL_MMA_REGS <= TWS_THREADS * 168, "setmaxnreg beyond the launch's registers");


// Persistent: block b takes tiles b, b + gridDim.x, ... (tw_tile's order); the ring runs on across
// tiles, so the copies of a tile's first slots overlap the previous tile's last MMAs and its store.
// HILO (DEPTH 0): tree_wgmma_kernel's hi / lo GEMM: slot s holds 64 k of part s % 2 (hi, then lo at
// a_lo) of block s / 2, all four k16 products issued (zero-filled past K), one accumulator from acc_in
// (or 0) over every slot.
// TMA (form 5): the copy warpgroup's first thread issues each slot as TMA copies (two boxes per slot,
// or four with an MN-major operand) with one expect-tx arrival on `full` for the slot's 32 KB; the MMA
// warpgroups are form 4's.
// PAIR (form 7; the fused BF16 depth-2 tree with TMA copies): sibling leaves 2p and 2p + 1 run side by
// side, one accumulator each: the ring's slots alternate between them (tw_pair_slots' order, the same
// for the copies and the MMAs) and each accumulator takes its own leaf's k16 products in the order form 5
// gives them, from 0; once both are summed, they are rounded and merged as tw_hold merges them. So
// the same products, roundings and merges as form 5, and half the leaf ends at which the MMA
// warpgroups wait for every MMA in flight (ncu of form 5: the tensor pipe 64 % busy; the Triton
// backend's persistent kernel gained 0.52-0.78x -> 0.64-0.82x cuBLAS from the same pairing, its
// PersistentTiles.loop = 3).
// ROLL (form 8; the fused BF16 depth-2 tree with TMA copies): the leaves run one after another as in form 5
// (the same slots in the same order, for the copies too), leaf l summed into accumulator l % 2 from 0; a
// leaf is rounded and merged (tw_roll_hold: tw_hold's steps, leaf 2's rounded sums parked in shared memory
// in place of h1) only once the first slot of the next leaf has been issued and wgmma.wait_group has seen
// every earlier group complete, so the tensor pipe has that slot's MMAs while the MMA warpgroups round; a
// tile's last leaf is rounded and the tile stored the same way, after the first slot of the block's next
// tile. So the same products per accumulator in the same order, the same roundings and merges, and no
// wait for every MMA in flight but after the block's last tile (form 7 waits at two per tile; a product
// with an empty leaf runs form 5; ncu of form 7's q projection on an H100: the tensor pipe 65.5 % busy against the Triton
// kernel's 74.5 %, evidence/2026-12-07-h100-chain-56d6ddf).
// SWIGLU (rl_det_gemm_swiglu; the depth-2 fused tree, K-major operands, TMA copies): g.N = F, and B holds
// 2F columns, the gate projection's at 0 .. F - 1 and the up projection's from s_acc (= F) on; a block
// computes the gate tile (n0) and then the up tile (s_acc + n0) of its rows, each the fused tree of
// the rest of this kernel (the same slots, products, roundings and merges), holds the gate tile's
// BF16 result, and stores only swiglu(gate, up) (tw_store_swiglu): neither projection is written.
template <int DEPTH, bool OUT_F32, bool A_MN, bool B_MN, bool LEAVES = false, bool HILO = false, bool TMA = false,
          bool PAIR = false, bool SWIGLU = false, bool ROLL = false>
__global__ void __launch_bounds__(TWS_THREADS, 1)
    tree_wgmma_ws_kernel(TreeArgs g, int pairs, const bf16* a_lo, const float* acc_in, int64_t s_acc,
                         const __grid_constant__ std::conditional_t<TMA, TwMaps, TwNoMaps> maps) {
    static_assert(!(OUT_F32 || LEAVES || HILO) || DEPTH == 0, "FP32 output, hi / lo and the leaf workspace are single leaves");
    static_assert(!(HILO && LEAVES), "hi / lo products have no leaf workspace");
    static_assert(!PAIR || (DEPTH == 2 && TMA), "the paired leaves are form 7's: the depth-2 fused tree with TMA copies");
    static_assert(!SWIGLU || (DEPTH == 2 && TMA && !PAIR && !A_MN && !B_MN),
                  "the SwiGLU epilogue runs the depth-2 fused tree of x @ w^T with TMA copies");
    static_assert(HILO_BLOCK == TW_SK, "a hi / lo block is one ring slot of each part");
    static_assert(!ROLL || (DEPTH == 2 && TMA && !OUT_F32 && !LEAVES && !HILO && !PAIR && !SWIGLU),
                  "the rolled leaves are form 8's: the depth-2 fused BF16 tree with TMA copies");
    constexpr int NL = 1 << DEPTH;
    const int first = LEAVES ? static_cast<int>(blockIdx.z) : 0;  // the block's first leaf
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int tid = threadIdx.x;
    const int wg = tid >> 7;  // 0: copies; 1, 2: rows 64 (wg - 1) .. + 63 of the tile
    const int64_t tiles = cdiv(g.M, TW_BM) * cdiv(g.N, TW_BN);

    const uint32_t ring = smem_u32(smem_raw);
    if (ring & 1023u) __trap();  // dynamic shared memory starts 1024-byte aligned
    const uint32_t full = ring + TWS_STAGES * TW_SLOT;  // full[s] at full + 8 s, empty[s] after them
    const uint32_t empty = full + 8 * TWS_STAGES;
    if (tid == 0) {
        for (int s = 0; s < TWS_STAGES; ++s) {
            mbar_init(full + 8 * s, TMA ? 1 : 128);  // one arrival per copy thread (TMA: one, with the bytes)
            mbar_init(empty + 8 * s, 2);   // one arrival per MMA warpgroup
        }
        if constexpr (TMA) fence_mbar_init();
    }
    __syncthreads();

    if (wg == 0) {
        setmaxnreg_dec<ROLL ? TWS_ROLL_COPY_REGS : TWS_COPY_REGS>();
        if constexpr (TMA) {
            if (tid != 0) return;
            int j = 0;
            for (int64_t pid = blockIdx.x; pid < tiles; pid += gridDim.x) {
                int64_t m0, n0;
                tw_tile(g, pid, m0, n0);
                // slot j: once its ring place is empty, the boxes at k kr of the leaf's maps
                auto slot = [&](const TmaMap* am, const TmaMap* bm, int64_t kr) {
                    tw_tma_slot<A_MN, B_MN, TW_BN, TWS_STAGES, TW_SLOT>(j++, ring, full, empty, am, bm, m0, n0, kr);
                };
                if (HILO) {
                    for (int64_t k0 = 0; k0 < g.K; k0 += HILO_BLOCK) {
                        slot(&maps.a[0], &maps.b[0], k0);  // hi
                        slot(&maps.lo, &maps.b[0], k0);    // lo
                    }
                } else if (SWIGLU) {  // the gate tile's leaves, then the up tile's
                    for (int half = 0; half < 2; ++half) {
                        const int64_t nb = n0 + (half ? s_acc : 0);
                        for (int lf = 0; lf < NL; ++lf)
                            for (int64_t k0 = 0; k0 < tp_bound(g, lf + 1) - tp_bound(g, lf); k0 += TW_SK)
                                tw_tma_slot<A_MN, B_MN, TW_BN, TWS_STAGES, TW_SLOT>(j++, ring, full, empty, &maps.a[lf],
                                                                                   &maps.b[lf], m0, nb, k0);
                    }
                } else if (PAIR) {
                    for (int p = 0; p < NL; p += 2)
                        tw_pair_slots(g, p, [&](int lf, int64_t i) { slot(&maps.a[lf], &maps.b[lf], i * TW_SK); });
                } else {
                    for (int lf = first; lf < first + NL; ++lf)
                        for (int64_t k0 = 0; k0 < tp_bound(g, lf + 1) - tp_bound(g, lf); k0 += TW_SK)
                            slot(&maps.a[lf], &maps.b[lf], k0);
                }
            }
            return;
        }
        // The copies, slot by slot in the order the MMA warpgroups consume them: per tile, leaf lf from
        // its first index in 64-k slots (empty leaves have none).
        int j = 0;
        for (int64_t pid = blockIdx.x; pid < tiles; pid += gridDim.x) {
            int64_t m0, n0;
            tw_tile(g, pid, m0, n0);
            TwCopies<A_MN> ca[2];
            TwCopies<B_MN> cb[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                ca[h].init(g.a, g.s_am, g.s_ak, m0, g.M, tid + 128 * h);
                cb[h].init(g.b, g.s_bn, g.s_bk, n0, g.N, tid + 128 * h);
            }
            // slot j: once its ring place is empty, the copies of k0 .. k0 + 63 (A from part a_part on)
            auto slot = [&](int64_t k0, int64_t hi, int64_t a_part) {
                const int s = j % TWS_STAGES;
                if (j >= TWS_STAGES) mbar_wait(empty + 8 * s, ((j / TWS_STAGES) - 1) & 1);
                const uint32_t d = ring + s * TW_SLOT;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    ca[h].issue(d, k0, hi, g.s_ak, g.a, a_part);
                    cb[h].issue(d + TW_HALF, k0, hi, g.s_bk, g.a);
                }
                cp_async_mbar_arrive(full + 8 * s);
                ++j;
            };
            if (HILO) {
                for (int64_t k0 = 0; k0 < g.K; k0 += HILO_BLOCK) {
                    slot(k0, g.K, 0);          // hi
                    slot(k0, g.K, a_lo - g.a);  // lo
                }
            } else {
                for (int lf = first; lf < first + NL; ++lf)
                    for (int64_t k0 = tp_bound(g, lf); k0 < tp_bound(g, lf + 1); k0 += TW_SK) slot(k0, tp_bound(g, lf + 1), 0);
            }
        }
        cp_async_wait<0>();
        return;
    }

    setmaxnreg_inc<ROLL ? TWS_ROLL_MMA_REGS : TWS_MMA_REGS>();
    const int cw = wg - 1;                   // the MMA warpgroup: rows 64 cw .. 64 cw + 63 of the tile
    const int warp = (tid >> 5) & 3;         // warp in the warpgroup: 16 of those rows
    const bool leader = (tid & 127) == 0;    // arrives on `empty` for the warpgroup
    const uint64_t desc0 = A_MN ? wg_desc_sw128_mn(ring + cw * 8192, 8192) : wg_desc_sw128(ring + cw * (64 * 128));
    const uint64_t descb0 = B_MN ? wg_desc_sw128_mn(ring + TW_HALF, 8192) : wg_desc_sw128(ring + TW_HALF);
    float acc[64];
    uint32_t h0[32], h1[32];
    int consumed = 0;  // slots whose MMAs this warpgroup has issued
    int released = 0;  // slots it has given back (released == consumed or consumed - 1)
    if constexpr (PAIR) {
        float acc2[64];  // leaf 2p + 1's sums (acc: leaf 2p's)
        // slot `consumed` into `d` (form 5's steps; until 2026-12-07 with the fence.proxy.async form 5 dropped
        // in 5a6cb3b, kept here so that a sweep could isolate the pairing; a TMA-filled ring needs none)
        auto consume = [&](float (&d)[64], int64_t i, int64_t steps) {
            tw_consume_slot<A_MN, B_MN, TWS_STAGES, TW_SLOT, false>(d, i, steps, consumed, released, full, empty, desc0, descb0,
                                                             leader);
            ++consumed;
        };
        for (int64_t pid = blockIdx.x; pid < tiles; pid += gridDim.x) {
            int64_t m0, n0;
            tw_tile(g, pid, m0, n0);
#pragma unroll
            for (int p = 0; p < NL; p += 2) {
                const int64_t steps0 = cdiv(tp_bound(g, p + 1) - tp_bound(g, p), static_cast<int64_t>(TB_K));
                const int64_t steps1 = cdiv(tp_bound(g, p + 2) - tp_bound(g, p + 1), static_cast<int64_t>(TB_K));
                tw_acc_start<false>(acc, g, nullptr, 0, 0, 0);
                tw_acc_start<false>(acc2, g, nullptr, 0, 0, 0);
                tw_pair_slots(g, p, [&](int lf, int64_t i) {
                    if (lf == p) {
                        consume(acc, i, steps0);
                    } else {
                        consume(acc2, i, steps1);
                    }
                });
                wg_wait0();  // both leaves' sums are in acc / acc2, and every slot's MMAs have read their operands
                for (; released < consumed; ++released)
                    if (leader) mbar_arrive(empty + 8 * (released % TWS_STAGES));
                tw_hold_pair(p, acc, acc2, h0);
            }
            tw_store<false, false>(g, acc, h0, m0 + 64 * cw + 16 * warp, n0, first, pairs);
        }
        return;
    }
    if constexpr (ROLL) {
        float acc2[64];  // the odd leaves' sums (acc: the even leaves')
        uint32_t* park = reinterpret_cast<uint32_t*>(smem_raw + TWS_PARK) + (tid - 128);  // leaf 2, rounded
        int64_t pm0 = 0, pn0 = 0;  // the tile whose leaf 3 is summed but not yet rounded (after the first tile)
        // the tile (pm0, pn0) whose leaf 3 is rounded and merged into h0: stored (once the loop of the next tile's
        // leaf 0 has issued its slots: inside it, the store's addresses beside two accumulators spilled 1.7 KB per
        // thread, ptxas -v)
        auto store = [&]() { tw_store_parked(g, park, pm0 + 64 * cw + 16 * warp, pn0, pairs); };
        // leaf L of tile (m0, n0) into a (acc for even L, acc2 for odd: one compile-time array each); once its
        // first slot is issued, every earlier group has completed (wg_wait1): the leaf before is rounded then
        auto leaf = [&](auto lc, float (&a)[64], bool after_tile) {
            constexpr int L = decltype(lc)::value;
            const int64_t width = tp_bound(g, L + 1) - tp_bound(g, L);
            const int64_t steps = cdiv(width, static_cast<int64_t>(TB_K));
            const int64_t slots = cdiv(width, static_cast<int64_t>(TW_SK));  // >= 1 (the launcher checks)
            tw_acc_start<false>(a, g, nullptr, 0, 0, 0);  // (leaf L - 2, its last user, is rounded)
            for (int64_t i = 0; i < slots; ++i, ++consumed) {
                tw_consume_slot<A_MN, B_MN, TWS_STAGES, TW_SLOT, false>(a, i, steps, consumed, released, full, empty, desc0,
                                                                       descb0, leader);
                if (i == 0) {
                    if constexpr (L == 1) tw_roll_hold<0>(acc, h0, park);
                    if constexpr (L == 2) tw_roll_hold<1>(acc2, h0, park);
                    if constexpr (L == 3) tw_roll_hold<2>(acc, h0, park);
                    if constexpr (L == 0) {
                        if (after_tile) tw_roll_hold<3>(acc2, h0, park);
                    }
                }
            }
            if constexpr (L == 0) {
                if (after_tile) store();
            }
        };
        bool after_tile = false;
        for (int64_t pid = blockIdx.x; pid < tiles; pid += gridDim.x) {
            int64_t m0, n0;
            tw_tile(g, pid, m0, n0);
            leaf(std::integral_constant<int, 0>{}, acc, after_tile);
            leaf(std::integral_constant<int, 1>{}, acc2, after_tile);
            leaf(std::integral_constant<int, 2>{}, acc, after_tile);
            leaf(std::integral_constant<int, 3>{}, acc2, after_tile);
            pm0 = m0;
            pn0 = n0;
            after_tile = true;
        }
        wg_wait0();  // the block's last leaf
        for (; released < consumed; ++released)
            if (leader) mbar_arrive(empty + 8 * (released % TWS_STAGES));
        if (after_tile) {
            tw_roll_hold<3>(acc2, h0, park);
            store();
        }
        return;
    }
    if constexpr (SWIGLU) {
        uint32_t* park = reinterpret_cast<uint32_t*>(smem_raw + TWS_PARK) + (tid - 128);  // the gate tile's tree
        for (int64_t pid = blockIdx.x; pid < tiles; pid += gridDim.x) {
            int64_t m0, n0;
            tw_tile(g, pid, m0, n0);
#pragma unroll
            for (int half = 0; half < 2; ++half) {
#pragma unroll
                for (int l = 0; l < NL; ++l) {
                    const int64_t width = tp_bound(g, l + 1) - tp_bound(g, l);
                    const int64_t steps = cdiv(width, static_cast<int64_t>(TB_K));
                    const int64_t slots = cdiv(width, static_cast<int64_t>(TW_SK));
                    tw_acc_start<false>(acc, g, nullptr, 0, 0, 0);
                    tw_leaf_mmas<A_MN, B_MN, TWS_STAGES, TW_SLOT, false>(acc, slots, steps, consumed, released, full, empty,
                                                                  desc0, descb0, leader);
                    tw_hold(l, acc, h0, h1);
                }
                if (half == 0) {
#pragma unroll
                    for (int q = 0; q < 32; ++q) park[256 * q] = h0[q];  // read back by this thread only
                }
            }
            tw_store_swiglu(g, park, h0, m0 + 64 * cw + 16 * warp, n0, pairs);
        }
        return;
    }
    for (int64_t pid = blockIdx.x; pid < tiles; pid += gridDim.x) {
        int64_t m0, n0;
        tw_tile(g, pid, m0, n0);
#pragma unroll
        for (int l = 0; l < NL; ++l) {
            const int64_t width = tp_bound(g, first + l + 1) - tp_bound(g, first + l);
            const int64_t steps = HILO ? 4 * cdiv(g.K, static_cast<int64_t>(HILO_BLOCK)) : cdiv(width, static_cast<int64_t>(TB_K));
            const int64_t slots = HILO ? 2 * cdiv(g.K, static_cast<int64_t>(HILO_BLOCK)) : cdiv(width, static_cast<int64_t>(TW_SK));
            tw_acc_start<HILO>(acc, g, acc_in, s_acc, m0 + 64 * cw + 16 * warp, n0);
            tw_leaf_mmas<A_MN, B_MN, TWS_STAGES, TW_SLOT, !TMA>(acc, slots, steps, consumed, released, full, empty, desc0,
                                                          descb0, leader);
            if (!OUT_F32) tw_hold(l, acc, h0, h1);
        }
        tw_store<OUT_F32, LEAVES>(g, acc, h0, m0 + 64 * cw + 16 * warp, n0, first, pairs);
    }
}



template <int DEPTH, bool OUT_F32, bool A_MN, bool B_MN, bool LEAVES, bool HILO, bool TMA, class Maps, bool PAIR = false,
          bool SWIGLU = false, bool ROLL = false>
int launch_tree_wgmma_ws_grid(const TreeArgs& g, cudaStream_t st, int leaves, const bf16* lo, const float* acc_in,
                              int64_t s_acc, const Maps& maps) {
    auto kernel = tree_wgmma_ws_kernel<DEPTH, OUT_F32, A_MN, B_MN, LEAVES, HILO, TMA, PAIR, SWIGLU, ROLL>;
    constexpr int smem = (SWIGLU || ROLL) ? TWS_SMEM_SWIGLU : TWS_SMEM;  // (ROLL parks leaf 2 as SWIGLU parks its gate)
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))
        return static_cast<int>(e);
    const int64_t tiles = cdiv(g.M, TW_BM) * cdiv(g.N, TW_BN);
    const int pairs = tp_pairs(g.c, g.s_cm, g.s_cn, OUT_F32);
    // persistent: one block per SM (for the leaf-parallel leaves, per SM and leaf), never more than tiles
    int64_t blocks = tiles;
    if (g_tws_persistent) {
        int dev = 0, sms = 0;
        if (cudaError_t e = cudaGetDevice(&dev)) return static_cast<int>(e);
        if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) return static_cast<int>(e);
        const int64_t per_leaf = LEAVES ? cdiv(static_cast<int64_t>(sms), static_cast<int64_t>(leaves)) : sms;
        if (per_leaf < blocks) blocks = per_leaf;
    }
    const dim3 grid(static_cast<unsigned>(blocks), 1, static_cast<unsigned>(LEAVES ? leaves : 1));
    kernel<<<grid, TWS_THREADS, smem, st>>>(g, pairs, lo, acc_in, s_acc, maps);
    return launch_status();
}

template <int DEPTH, bool OUT_F32, bool A_MN, bool B_MN, bool LEAVES = false, bool HILO = false>
int launch_tree_wgmma_ws_as(const TreeArgs& g, cudaStream_t st, int leaves = 1, const bf16* lo = nullptr,
                            const float* acc_in = nullptr, int64_t s_acc = 0) {
    static_assert(TW_BN == TW_BM, "one box geometry for both operands");
    const int map_leaves = LEAVES ? leaves : (HILO ? 1 : 1 << DEPTH);
    if (g_tree_form >= 5) {
        TwMaps maps{};  // (copied into the launch's parameters)
        if (tw_maps<A_MN, B_MN>(maps, g, map_leaves, HILO ? lo : nullptr)) {
            ++g_tws_tma_launches;
            if constexpr (DEPTH == 2 && !OUT_F32 && !LEAVES && !HILO) {
                if (g_tree_form == 7) {  // the sibling leaves side by side
                    ++g_tws_pair_launches;
                    return launch_tree_wgmma_ws_grid<DEPTH, false, A_MN, B_MN, false, false, true, TwMaps, true>(
                        g, st, leaves, lo, acc_in, s_acc, maps);
                }
                if (g_tree_form == 8 && g.bounds[1] > g.bounds[0] && g.bounds[2] > g.bounds[1] && g.bounds[3] > g.bounds[2] &&
                    g.bounds[4] > g.bounds[3]) {  // the leaves rolled (every leaf has a slot): each rounded under the next one's first MMAs
                    ++g_tws_roll_launches;
                    return launch_tree_wgmma_ws_grid<DEPTH, false, A_MN, B_MN, false, false, true, TwMaps, false, false,
                                                     true>(g, st, leaves, lo, acc_in, s_acc, maps);
                }
            }
            return launch_tree_wgmma_ws_grid<DEPTH, OUT_F32, A_MN, B_MN, LEAVES, HILO, true>(g, st, leaves, lo, acc_in, s_acc, maps);
        }
    }
    return launch_tree_wgmma_ws_grid<DEPTH, OUT_F32, A_MN, B_MN, LEAVES, HILO, false>(g, st, leaves, lo, acc_in, s_acc, TwNoMaps{});
}

// The product's layouts (A, B) as tree_wgmma_ok admits them: (K, K), (K, MN) or (MN, MN).
enum class TwLayout { KK, KMN, MNMN };
__host__ inline TwLayout tw_layout(const TreeArgs& g) {
    return g.s_ak != 1 ? TwLayout::MNMN : g.s_bk == 1 ? TwLayout::KK : TwLayout::KMN;
}
// f(A_MN, B_MN) for the product's layout, the two as std::bool_constant (template arguments for f's launch).
template <class F>
__host__ int tw_with_layout(const TreeArgs& g, F&& f) {
    switch (tw_layout(g)) {
        case TwLayout::KK: return f(std::false_type{}, std::false_type{});
        case TwLayout::KMN: return f(std::false_type{}, std::true_type{});
        default: return f(std::true_type{}, std::true_type{});
    }
}

}  // namespace
