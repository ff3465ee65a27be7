// Small host helpers of the cuda_bf16 library: error strings and an ABI version the Python loader
// checks, so a stale cached library is never called with a newer argument list.
#include "common.cuh"

// Bump when any exported prototype changes (the loader compares it with cuda_build.ABI_VERSION).
#define RL_ABI_VERSION 2

RL_EXPORT const char* rl_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

RL_EXPORT int rl_abi_version(void) { return RL_ABI_VERSION; }

int rl::g_programmatic_launch = 0;

// Set the PDL mode of later launches (common.cuh: 0 off, 1 on, 2 on with early weight copies);
// returns the previous mode, or -1 for a mode out of range (nothing changed). A CUDA graph keeps
// the launches it captured as they were.
RL_EXPORT int64_t rl_set_programmatic_launch(int64_t mode) {
    if (mode < 0 || mode > 2) return -1;
    const int64_t old = rl::g_programmatic_launch;
    rl::g_programmatic_launch = static_cast<int>(mode);
    return old;
}
