/*
bench_common.cuh: what the layer benchmarks in dev/bench share: a deterministic device fill (a hash of the index, so
no host copy and the same numbers every run) and the timing rule of dev/bench/README.md (CUDA events on the stream,
3 warm-up calls, the median of the repeats).
*/
#ifndef M2RNN_BENCH_COMMON_CUH
#define M2RNN_BENCH_COMMON_CUH

#include <algorithm>
#include <vector>
#include "cuda_common.h"

// x[i] = uniform in [offset − scale, offset + scale), from a hash of (i, seed)
template <typename T>
__global__ void bench_fill_kernel(T *x, long n, uint32_t seed, float scale, float offset) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
        x[i] = (T)(offset + ((h >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale);
    }
}
// the integer arguments after the program's name, or dflt where none are given (e.g. the row counts to time)
static std::vector<int> bench_int_args(int argc, char **argv, std::vector<int> dflt) {
    std::vector<int> v;
    for (int i = 1; i < argc; i++) { v.push_back(atoi(argv[i])); }
    return v.empty() ? dflt : v;
}
template <typename T> static void bench_fill(T *x, size_t n, uint32_t seed, float scale, float offset = 0.0f) {
    bench_fill_kernel<<<1024, 256>>>(x, (long)n, seed, scale, offset);
    cudaCheck(cudaGetLastError());
}

// the median of `repeats` timings of f (CUDA events on stream) after 3 warm-up calls; prep runs before each call,
// outside the timing (e.g. the forward that a backward needs)
template <class F, class P> static float median_ms(F f, int repeats, cudaStream_t stream, P prep) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) {
        prep();
        f();
    }
    std::vector<float> ms;
    for (int i = 0; i < repeats; i++) {
        prep();
        cudaCheck(cudaEventRecord(a, stream));
        f();
        cudaCheck(cudaEventRecord(b, stream));
        cudaCheck(cudaEventSynchronize(b));
        float t = 0;
        cudaCheck(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}
template <class F> static float median_ms(F f, int repeats, cudaStream_t stream) {
    return median_ms(f, repeats, stream, [] {});
}

// ms a call of f as a decode step runs it: `calls` calls captured in one CUDA graph, the median of `repeats` replays
// (median_ms) divided by `calls`
template <class F> static float graph_median_ms(F f, int calls, int repeats, cudaStream_t stream) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    cudaCheck(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    for (int r = 0; r < calls; r++) { f(); }
    cudaCheck(cudaStreamEndCapture(stream, &graph));
    cudaCheck(cudaGraphInstantiate(&exec, graph, 0));
    const float ms = median_ms([&]() { cudaCheck(cudaGraphLaunch(exec, stream)); }, repeats, stream);
    cudaCheck(cudaGraphExecDestroy(exec));
    cudaCheck(cudaGraphDestroy(graph));
    return ms / calls;
}

#endif // M2RNN_BENCH_COMMON_CUH
