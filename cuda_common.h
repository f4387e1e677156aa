/*
cuda_common.h: the small GPU foundation every CUDA program and kernel header of this project includes.
- cudaCheck / cudaFreeCheck: every fallible CUDA runtime call is wrapped; on failure they print what failed and where,
  and exit(EXIT_FAILURE). Nothing returns an error code the caller could forget.
- floatX = __nv_bfloat16: the activation/parameter storage type of the trainer (bf16 in, fp32 accumulation inside).
- CEIL_DIV, WARP_SIZE and the warp reductions (sum, max) the kernels share; the current device's SM count (cached).
- Programmatic dependent launch for a decode step's chain of small kernels (launch_k, pdl_wait, pdl_trigger).
- ld_acquire_gpu: an acquire load of a flag another CTA releases (waits between concurrent kernels or CTAs).
- With -DM2RNN_TRACE only: a record per block of each waiting kernel, a decode step's timeline (dev/bench/decode_trace.py).
- Environment switches read once into a cache (env_on_unless_0, env_off_unless_1, env_int), or each call (env_is_1).
- A kernel's dynamic shared-memory limit raised once per kernel, device and size (kernel_smem_limit).
Kept deliberately small and general: op-specific helpers live beside their op (e.g. m2rnn_kernels.cuh).
*/
#ifndef M2RNN_CUDA_COMMON_H
#define M2RNN_CUDA_COMMON_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utility>

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

// Environment switches, each read once into its cache (an int: -1 not read yet; tests and benchmarks set a cache to
// 0 or 1 directly, or back to -1 to read the variable again).
// on unless the variable is "0"
static inline bool env_on_unless_0(int *cache, const char *name) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = !(e != NULL && strcmp(e, "0") == 0);
    }
    return *cache != 0;
}
// the variable is "1" (read now, not cached: switches read once per call, e.g. at a model's decode begin)
static inline bool env_is_1(const char *name) {
    const char *e = getenv(name);
    return e != NULL && strcmp(e, "1") == 0;
}
// off unless the variable is "1"
static inline bool env_off_unless_1(int *cache, const char *name) {
    if (*cache < 0) { *cache = env_is_1(name); }
    return *cache == 1;
}
// an integer: the variable's value, or fallback where it is unset (a negative value is read again each time)
static inline int env_int(int *cache, const char *name, int fallback) {
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e != NULL ? atoi(e) : fallback;
    }
    return *cache;
}

// the SM count of the current device, cached per device (one process may drive GPUs of different sizes)
static inline int device_num_sms(void) {
    static int sms[64];
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    if (dev < 64 && sms[dev] != 0) { return sms[dev]; }
    int n = 0;
    cudaCheck(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    if (dev < 64) { sms[dev] = n; }
    return n;
}

// A kernel's dynamic shared-memory limit raised to at least smem where that is over the 48 KB default, once per
// kernel, device and size: cudaFuncSetAttribute is a host call that eager launches (prefill, training) would
// otherwise repeat at every launch. Every launcher of a kernel over 48 KB goes through here.
static void kernel_smem_limit(const void *kernel, size_t smem) {
    if (smem <= 48 * 1024) { return; }
    static struct { const void *kernel; int dev, bytes; } set[512];
    static int nset = 0;
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    int i = 0;
    while (i < nset && !(set[i].kernel == kernel && set[i].dev == dev)) { i++; }
    if (i < nset && set[i].bytes >= (int)smem) { return; }
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (i < nset) {
        set[i].bytes = (int)smem;
    } else if (nset < 512) {
        set[nset++] = {kernel, dev, (int)smem};
    }
}
template <typename... KArgs> static void kernel_smem_limit(void (*kernel)(KArgs...), size_t smem) {
    kernel_smem_limit((const void *)kernel, smem);
}

// ----------------------------------------------------------------------------------------------------------------
// programmatic dependent launch (sm_90)
//
// A decode step is a chain of a few hundred small dependent kernels, each waiting for the one before to finish and
// then to be launched (graph replay removes the host's cost, not this). While launch_pdl is set (lm.cuh's decode_run,
// around one step's launches), launch_k() launches with programmatic stream serialization: the kernel is started
// while the one before it still runs, and its pdl_wait() returns once that one has completed with its writes visible.
// A kernel launched through launch_k therefore calls pdl_wait() before it touches any memory the kernels before it
// write or read (it may read the weights before: nothing writes them while decoding), and every such kernel waits, so
// "completed" is transitive down the chain. pdl_trigger() lets the next kernel start now instead of when this one's
// blocks exit. Launched the ordinary way (launch_pdl 0: training, prefill), both instructions do nothing.
static int launch_pdl = 0;

#ifdef M2RNN_TRACE
// A decode step's timeline, for timing experiments only (build/bench_infer_trace: -DM2RNN_TRACE; without it the hooks
// below are empty). While g_trace_on, the first thread of each block of every kernel that calls pdl_wait() writes a
// record: when it reached the wait and left it, and, where the kernel marks them, when its input rows were ready
// (trace_rows), points inside its prologue (trace_mark) and when its last warp ended (trace_end). The flag's load and
// the slot's atomic come before the wait, so after it only clock reads and stores are added. dev/bench/decode_trace.py
// reads the records. (The build itself is slower: 0.50 → 0.60 ms at batch 1; compare its parts, not its total.)
typedef struct {
    unsigned long long tag;                           // gridDim.x | blockIdx.x << 20 | dynamic smem / 16 << 40
    unsigned long long gt_pre, gt_wait;               // globaltimer (ns, in 32 ns steps) at the wait and after it
    unsigned long long c_pre, c_wait, c_rows, c_end;  // clock64: at/after the wait, input rows ready, end (warps' max)
    unsigned long long smid, gt_rows, gt_end;         // globaltimer: input rows ready, end (warps' max)
    unsigned long long mark[6];                       // clock64 at trace_mark(i)
} TraceRec;
__device__ TraceRec *g_trace;
__device__ unsigned g_trace_n, g_trace_cap;
__device__ int g_trace_on;
__shared__ unsigned g_trace_slot;
__device__ __forceinline__ unsigned long long trace_gt() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void trace_mark(int i) {
    if (threadIdx.x == 0 && g_trace_slot != ~0u) { g_trace[g_trace_slot].mark[i] = clock64(); }
}
__device__ __forceinline__ void trace_rows() {
    if (threadIdx.x == 0 && g_trace_slot != ~0u) {
        g_trace[g_trace_slot].c_rows = clock64();
        g_trace[g_trace_slot].gt_rows = trace_gt();
    }
}
// each warp's end (synced: a block barrier came after the wait, so every warp sees thread 0's slot; else warp 0's)
__device__ __forceinline__ void trace_end(bool synced = true) {
    if ((synced ? threadIdx.x % 32 : threadIdx.x) == 0 && g_trace_slot != ~0u) {
        atomicMax(&g_trace[g_trace_slot].c_end, (unsigned long long)clock64());
        atomicMax(&g_trace[g_trace_slot].gt_end, trace_gt());
    }
}
__device__ __forceinline__ void pdl_wait() {
    unsigned slot = ~0u;
    if (threadIdx.x == 0) {
        if (*(volatile int *)&g_trace_on) {
            slot = atomicAdd(&g_trace_n, 1u);
            if (slot >= g_trace_cap) { slot = ~0u; }
        }
        g_trace_slot = slot;
    }
    const unsigned long long g0 = trace_gt(), c0 = clock64();
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    if (slot != ~0u) {
        const unsigned long long c1 = clock64(), g1 = trace_gt();
        unsigned sm, dsm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dsm));
        TraceRec *r = g_trace + slot;
        r->tag = gridDim.x | (unsigned long long)blockIdx.x << 20 | (unsigned long long)(dsm / 16) << 40;
        r->gt_pre = g0; r->gt_wait = g1; r->c_pre = c0; r->c_wait = c1; r->smid = sm;
    }
}
#else
__device__ __forceinline__ void trace_rows() {}
__device__ __forceinline__ void trace_mark(int) {}
__device__ __forceinline__ void trace_end(bool = true) {}
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
#endif
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
// a load of *p with acquire semantics at GPU scope: the writes another CTA made before its release of p are visible
// after it (a flag one CTA waits on while another sets it)
__device__ __forceinline__ int ld_acquire_gpu(const int *p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
// brings the 128-byte line at p into L2 (a weight the kernel will read after pdl_wait)
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// a launch's attributes into attr (room for 2), their count: programmatic with pdl; with cluster (not 1 × 1 × 1) the
// grid's CTAs in thread block clusters of that shape
static unsigned launch_attrs(cudaLaunchAttribute *attr, int pdl, dim3 cluster) {
    unsigned n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster.x * cluster.y * cluster.z > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster.x;
        attr[n].val.clusterDim.y = cluster.y;
        attr[n++].val.clusterDim.z = cluster.z;
    }
    return n;
}
// kernel<<<grid, block, smem, stream>>>(args...), programmatic while launch_pdl is set; with cluster (not 1 × 1 × 1)
// the grid's CTAs in thread block clusters of that shape (each grid dimension a multiple of the cluster's)
template <typename... KArgs, typename... Args>
static void launch_k_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                             dim3 cluster, Args &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    cfg.attrs = attr;
    cfg.numAttrs = launch_attrs(attr, launch_pdl, cluster);
    cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), __FILE__, __LINE__);
}
template <typename... KArgs, typename... Args>
static void launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                     Args &&...args) {
    launch_k_cluster(kernel, grid, block, smem, stream, dim3(1, 1, 1), std::forward<Args>(args)...);
}

// ----------------------------------------------------------------------------------------------------------------
// warp reductions (all lanes end with the result)

// inclusive prefix sum over the lanes (lane i ends with lanes 0..i's values), in a fixed order of adds
template <typename T> __device__ __forceinline__ T warp_scan_incl(T val) {
    const int lane = threadIdx.x % 32;
    for (int offset = 1; offset < 32; offset <<= 1) {
        const T o = __shfl_up_sync(0xffffffffu, val, offset);
        if (lane >= offset) { val += o; }
    }
    return val;
}

__device__ __forceinline__ float warp_reduce_sum(float val) {
    for (int offset = 16; offset > 0; offset >>= 1) { val += __shfl_xor_sync(0xffffffffu, val, offset); }
    return val;
}

__device__ __forceinline__ float warp_reduce_max(float val) {
    for (int offset = 16; offset > 0; offset >>= 1) { val = fmaxf(val, __shfl_xor_sync(0xffffffffu, val, offset)); }
    return val;
}

// RoPE ("rotate half": the pair (j, j + HS/2) of a head) at position t: the angle t·θ^(−2j/HS) and its cos, sin in
// double as ref/attention.h computes them, and the rotation of a pair (x1, x2) by (c, s) with its products and sums in
// a fixed form (each product rounded, then added): the rotation kernel (attention.cuh) and the fused decode step
// (attention_kernels.cuh) give the same bits
__device__ __forceinline__ float2 rope_cos_sin(int t, int j, int HS, float theta) {
    const double angle = t * pow((double)theta, -2.0 * j / HS);
    return make_float2((float)cos(angle), (float)sin(angle));
}
__device__ __forceinline__ void rope_rotate(float *o1, float *o2, float x1, float x2, float c, float s) {
    *o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    *o2 = __fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c));
}

#endif // M2RNN_CUDA_COMMON_H
