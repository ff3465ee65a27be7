// Runtime of the host emulator (see emu.h): user-space fibers, one per CUDA thread of a block,
// run round-robin on the calling OS thread; barriers are scheduler points.
//
// On x86-64 a fiber switch is emu_fiber_switch below: the System V ABI's callee-saved registers and the
// stack pointer, nothing else (the kernels change neither the signal mask nor the FP control state, and
// every switch is a function call, so the caller-saved registers are dead). glibc's swapcontext, used
// on other hosts, also saves the signal mask with a system call and the FP environment at each switch:
// under perf (2026-12-08, the 130 x 256 x 136 form-7 GEMM test) swapcontext and its rt_sigprocmask
// calls were about 45 % of the test's samples. Which fiber runs when is the same in both.
#include "emu.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <mutex>

EmuIdx emu_threadIdx;
EmuIdx emu_blockIdx;
EmuIdx emu_blockDim;
EmuIdx emu_gridDim;

namespace {

constexpr size_t STACK_BYTES = 256 * 1024;

#if defined(__x86_64__)
// emu_fiber_switch(&from_sp, to_sp): pushes rbp, rbx, r12 .. r15, stores the stack pointer in *from_sp,
// loads to_sp and pops the same six registers of the fiber switched to, returning into it.
extern "C" void emu_fiber_switch(void** from_sp, void* to_sp);
asm(R"(
    .text
    .globl emu_fiber_switch
    .hidden emu_fiber_switch
    .type emu_fiber_switch, @function
emu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_fiber_switch, .-emu_fiber_switch
)");

struct Context {
    void* sp = nullptr;
};
#else
using Context = ucontext_t;
#endif

struct Fiber {
    Context ctx;
    EmuIdx tid;
    int waiting = -1;  // barrier id it waits on (-1: runnable)
    bool done = false;
    std::vector<char> stack;
};

std::mutex g_launch;
std::vector<Fiber> g_fibers;
Context g_sched;
int g_cur = -1;
std::vector<int> g_arrived;    // per barrier id: 0 = block, 1 + w = warp w
std::vector<int> g_expected;
std::vector<float> g_scratch;
std::vector<unsigned char> g_dyn;
const std::function<void()>* g_body = nullptr;

// From fiber f back to the scheduler (run_block), and from the scheduler into fiber f.
void to_scheduler(Fiber& f) {
#if defined(__x86_64__)
    emu_fiber_switch(&f.ctx.sp, g_sched.sp);
#else
    swapcontext(&f.ctx, &g_sched);
#endif
}

void to_fiber(Fiber& f) {
#if defined(__x86_64__)
    emu_fiber_switch(&g_sched.sp, f.ctx.sp);
#else
    swapcontext(&g_sched, &f.ctx);
#endif
}

void fiber_main() {
    (*g_body)();
    g_fibers[g_cur].done = true;
    to_scheduler(g_fibers[g_cur]);  // a done fiber is never switched to again
    std::abort();
}

// A fiber's first switch lands at the top of its stack: on x86-64 six zero registers for
// emu_fiber_switch to pop, then fiber_main as the return address, then an empty slot standing for
// fiber_main's own return address (so fiber_main starts with the stack aligned as after a call).
void start_fiber(Fiber& f) {
#if defined(__x86_64__)
    auto top = reinterpret_cast<uintptr_t>(f.stack.data() + f.stack.size()) & ~static_cast<uintptr_t>(15);
    auto* slot = reinterpret_cast<void**>(top);
    *--slot = nullptr;                                      // fiber_main's return address (never used)
    *--slot = reinterpret_cast<void*>(&fiber_main);         // emu_fiber_switch's ret
    for (int r = 0; r < 6; ++r) *--slot = nullptr;          // r15, r14, r13, r12, rbx, rbp
    f.ctx.sp = slot;
#else
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_main, 0);
#endif
}

void wait_on(int id) {
    Fiber& f = g_fibers[g_cur];
    f.waiting = id;
    ++g_arrived[id];
    to_scheduler(f);
}

void release_completed() {
    for (size_t id = 0; id < g_arrived.size(); ++id) {
        if (g_arrived[id] > 0 && g_arrived[id] == g_expected[id]) {
            g_arrived[id] = 0;
            for (auto& f : g_fibers)
                if (f.waiting == static_cast<int>(id)) f.waiting = -1;
        }
    }
}

void run_block(unsigned nthreads) {
    for (unsigned t = 0; t < nthreads; ++t) {
        Fiber& f = g_fibers[t];
        f.waiting = -1;
        f.done = false;
        start_fiber(f);
    }
    std::fill(g_arrived.begin(), g_arrived.end(), 0);
    // Passes alternate between increasing and decreasing thread order, so a read of another
    // thread's shared-memory write that is not separated by a barrier sees the unwritten value
    // in one of the two orders (a missing __syncthreads shows up as a wrong result).
    for (unsigned pass = 0;; ++pass) {
        bool progress = false, all_done = true;
        for (unsigned i = 0; i < nthreads; ++i) {
            const unsigned t = (pass & 1u) ? nthreads - 1 - i : i;
            Fiber& f = g_fibers[t];
            if (f.done) continue;
            all_done = false;
            if (f.waiting >= 0) continue;
            g_cur = static_cast<int>(t);
            emu_threadIdx = f.tid;
            to_fiber(f);
            progress = true;
            release_completed();
        }
        if (all_done) return;
        if (!progress) {
            std::fprintf(stderr, "cuda emulator: deadlock in block (%u, %u, %u): a barrier can never complete "
                                 "(non-uniform __syncthreads or warp collective)\n",
                         emu_blockIdx.x, emu_blockIdx.y, emu_blockIdx.z);
            std::abort();
        }
    }
}

}  // namespace

void emu_sync_block() { wait_on(0); }
void emu_yield() { to_scheduler(g_fibers[g_cur]); }  // stays runnable
void emu_sync_warp() { wait_on(1 + static_cast<int>(emu_threadIdx.x / 32)); }
float* emu_warp_scratch() { return g_scratch.data() + static_cast<size_t>(emu_threadIdx.x / 32) * 768; }
unsigned char* emu_dynamic_smem() { return g_dyn.data(); }

void emu_run_grid(const EmuCfg& cfg, const std::function<void()>& body) {
    std::lock_guard<std::mutex> guard(g_launch);
    const unsigned nthreads = cfg.block.x * cfg.block.y * cfg.block.z;
    const unsigned nwarps = (nthreads + 31) / 32;
    if (g_fibers.size() < nthreads) g_fibers.resize(nthreads);
    for (unsigned t = 0; t < nthreads; ++t) {
        if (g_fibers[t].stack.size() != STACK_BYTES) g_fibers[t].stack.assign(STACK_BYTES, 0);
        g_fibers[t].tid = EmuIdx{t % cfg.block.x, (t / cfg.block.x) % cfg.block.y, t / (cfg.block.x * cfg.block.y)};
    }
    g_arrived.assign(1 + nwarps, 0);
    g_expected.assign(1 + nwarps, 0);
    g_expected[0] = static_cast<int>(nthreads);
    for (unsigned w = 0; w < nwarps; ++w) g_expected[1 + w] = static_cast<int>((w + 1) * 32 <= nthreads ? 32 : nthreads - w * 32);
    g_scratch.assign(static_cast<size_t>(nwarps) * 768, 0.0f);
    // Poison dynamic shared memory with NaN bit patterns (0xFF bytes), so reads of unwritten
    // shared memory show up in the results.
    g_dyn.assign(cfg.smem + 16, 0xFF);
    emu_blockDim = EmuIdx{cfg.block.x, cfg.block.y, cfg.block.z};
    emu_gridDim = EmuIdx{cfg.grid.x, cfg.grid.y, cfg.grid.z};
    g_body = &body;
    for (unsigned bz = 0; bz < cfg.grid.z; ++bz)
        for (unsigned by = 0; by < cfg.grid.y; ++by)
            for (unsigned bx = 0; bx < cfg.grid.x; ++bx) {
                emu_blockIdx = EmuIdx{bx, by, bz};
                run_block(nthreads);
            }
    g_body = nullptr;
}

// The runtime calls the sources make. The emulated device has 2 SMs, so that a persistent grid (one
// block per SM) loops over several tiles at the tests' small shapes.
cudaError_t CUDARTAPI cudaGetLastError(void) { return cudaSuccess; }
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
    *device = 0;
    return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int) {
    if (attr != cudaDevAttrMultiProcessorCount) return cudaErrorInvalidValue;
    *value = 2;
    return cudaSuccess;
}
// gemm.cuh's tensor map, as emu.h's tma_load_2d reads it: the geometry, with the checks the driver makes
// (16-byte aligned base and row stride) and the 128-byte swizzle's box
// row of 64 BF16 elements.
namespace rl {
struct TmaMap;
int tma_map_bf16_2d(TmaMap* map, const void* base, uint64_t inner, uint64_t outer, uint64_t stride_bytes,
                    uint32_t box_inner, uint32_t box_outer) {
    if ((reinterpret_cast<uintptr_t>(base) & 15u) || (stride_bytes & 15u) || inner == 0 ||
        outer == 0 || box_inner * 2 != 128 || box_outer == 0 || box_outer > 256)
        return 1;
    const EmuTmaMap m{static_cast<const uint16_t*>(base), inner, outer, stride_bytes, box_inner, box_outer};
    std::memcpy(static_cast<void*>(map), &m, sizeof m);
    return 0;
}
}  // namespace rl

const char* CUDARTAPI cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error (emulated)" : "emulated CUDA error"; }
cudaError_t CUDARTAPI cudaFuncSetAttribute(const void*, enum cudaFuncAttribute, int) { return cudaSuccess; }
