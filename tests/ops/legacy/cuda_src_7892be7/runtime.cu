// Small host helpers of the cuda_bf16 library: error strings and an ABI version the Python loader
// checks, so a stale cached library is never called with a newer argument list.
#include "common.cuh"

// Bump when any exported prototype changes (the loader compares it with cuda_build.ABI_VERSION).
#define RL_ABI_VERSION 1

RL_EXPORT const char* rl_cuda_error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }

RL_EXPORT int rl_abi_version(void) { return RL_ABI_VERSION; }
