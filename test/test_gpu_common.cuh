/*
test_gpu_common.cuh: what the CUDA tests share: std::vector copies to and from the device, NaN-poisoned device
buffers (an output a kernel does not write then fails its check) and seedable splitmix64 random numbers (uniform in
[0, 1), normal). Included after test_common.h.
*/
#ifndef TEST_GPU_COMMON_CUH
#define TEST_GPU_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include <vector>
#include "cuda_common.h"

// a device copy of h, with 16 bytes of slack past its end (vector loads of a ragged tail stay inside the allocation)
template <class T> static T *to_device(const std::vector<T> &h) {
    T *d = nullptr;
    cudaCheck(cudaMalloc(&d, h.size() * sizeof(T) + 16));
    cudaCheck(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
template <class T> static std::vector<T> to_host(const T *d, size_t n) {
    std::vector<T> h(n);
    cudaCheck(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
// n elements of all-ones bytes: NaN in bf16 and fp32
template <class T> static void poison(T *d, size_t n) { cudaCheck(cudaMemset(d, 0xFF, n * sizeof(T))); }
// a new device buffer of n poisoned elements (and the same 16 bytes of slack)
template <class T> static T *device_poisoned(size_t n) {
    T *d = nullptr;
    cudaCheck(cudaMalloc(&d, n * sizeof(T) + 16));
    poison(d, n);
    return d;
}

// splitmix64; each test seeds rng_state before it draws
static uint64_t rng_state = 1;
static double rand_uniform() { // [0, 1)
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}
static double rand_normal() { // Box-Muller
    double u1 = rand_uniform(), u2 = rand_uniform();
    if (u1 < 1e-300) { u1 = 1e-300; }
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif // TEST_GPU_COMMON_CUH
