/*
cuda_common.h: the small GPU foundation every CUDA program and kernel header of this project includes.
- cudaCheck / cudaFreeCheck: every fallible CUDA runtime call is wrapped; on failure they print what failed and where,
  and exit(EXIT_FAILURE). Nothing returns an error code the caller could forget.
- floatX = __nv_bfloat16: the activation/parameter storage type of the trainer (bf16 in, fp32 accumulation inside).
- CEIL_DIV, WARP_SIZE and the warp reductions (sum, max) the kernels share.
Kept deliberately small and general: op-specific helpers live beside their op (e.g. m2rnn_kernels.cuh).
*/
#ifndef M2RNN_CUDA_COMMON_H
#define M2RNN_CUDA_COMMON_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

// ----------------------------------------------------------------------------------------------------------------
// error checking

static inline void cuda_check(cudaError_t error, const char *file, int line) {
    if (error != cudaSuccess) {
        fprintf(stderr, "[CUDA ERROR] at file %s:%d:\n%s (%s)\n", file, line, cudaGetErrorString(error),
                cudaGetErrorName(error));
        exit(EXIT_FAILURE);
    }
}
#define cudaCheck(err) (cuda_check(err, __FILE__, __LINE__))

// frees and NULLs the pointer, so a double free shows up as a no-op rather than a crash
template <class T> static inline void cuda_free_check(T **ptr, const char *file, int line) {
    cuda_check(cudaFree(*ptr), file, line);
    *ptr = nullptr;
}
#define cudaFreeCheck(ptr) (cuda_free_check(ptr, __FILE__, __LINE__))

// ----------------------------------------------------------------------------------------------------------------
// types and sizes

#ifdef ENABLE_FP32
typedef float floatX; // the fp32 build (make PRECISION=FP32): every kernel but the bf16 tensor-core recurrence
#define FLOATX_IS_FP32 1
#else
typedef __nv_bfloat16 floatX; // storage type of activations and parameters on the GPU
#define FLOATX_IS_FP32 0
#endif

#define WARP_SIZE 32
#define CEIL_DIV(M, N) (((M) + (N) - 1) / (N))

// ----------------------------------------------------------------------------------------------------------------
// warp reductions (all lanes end with the result)

__device__ __forceinline__ float warp_reduce_sum(float val) {
    for (int offset = 16; offset > 0; offset >>= 1) { val += __shfl_xor_sync(0xffffffffu, val, offset); }
    return val;
}

__device__ __forceinline__ float warp_reduce_max(float val) {
    for (int offset = 16; offset > 0; offset >>= 1) { val = fmaxf(val, __shfl_xor_sync(0xffffffffu, val, offset)); }
    return val;
}

#endif // M2RNN_CUDA_COMMON_H
