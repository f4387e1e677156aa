/*
attention_cudnn.cuh: the training path's causal attention (forward and backward) through cuDNN's fused flash-attention
engines, beside our own kernels of attention_kernels.cuh, which run every case this path does not take.

cuDNN has no "attention" call in its C API: its fused engines are found by describing the computation as an operation
graph (cuDNN's backend API) that the engines recognise. The graphs below are the ones cuDNN documents for scaled
dot-product attention (the same nodes, data types and order as NVIDIA's cudnn-frontend builds for a causal, unbiased,
dropout-free attention; facts of that API, not its code):

  forward:  S = Q·Kᵀ (fp32) → ·scale → causal mask (row index ≥ column index, else −∞) → softmax as max, sub, exp, sum,
            div (P rounded to bf16) → O = P·V;  Stats = max + log(sum), the log-sum-exp of the scaled scores
  backward: D = Σ dO∘O (written to our D buffer), P = exp(scale·Q·Kᵀ − Stats) masked, dV = Pᵀ·dO, dS = P∘(dO·Vᵀ − D)·
            scale, dK = dSᵀ·Q, dQ = dS·K (GQA: dK, dV summed over each kv head's query heads by a reduction node)

Determinism, as the M²RNN kernels: by default the backward is the graph with cuDNN's fp32 dQ accumulator (dQ summed
with atomics: the fastest form, O(T) memory, not bitwise repeatable); under M2RNN_DETERMINISTIC=1 it is the graph
without it (dQ = dS·K directly), which cuDNN's engines run deterministically but with a (B, NH, T, T) bf16 workspace
for dP, so it is taken only while that fits in a quarter of the GPU's memory; beyond, our deterministic kernels run
the shape. Measured in dev/bench/attention_results.md.

Loading: cuDNN is opened at run time (dlopen of libcudnn.so.9, or $M2RNN_CUDNN_LIB), so the programs build and run on
machines without it; the build needs only its headers (the Makefile adds -DUSE_CUDNN where cudnn_graph.h exists).
Which path runs: $M2RNN_ATTENTION = auto (the default: cuDNN where it loads, is ≥ 9.10 and has engines for the
shape, else ours), cudnn (refuse to run without it), ours. The choice is made once per shape for the forward and the
backward together (the two exchange the log-sum-exp, whose layout differs: ours (tokens, NH), cuDNN's (B, NH, T)),
and printed once per process.

Shapes taken: the fixed layout (no cu_seqlens, no len_k), causal with Lq = Lk (training), any strides; cuDNN itself
decides the head dims and sizes it accepts (32, 64 and 128 all ran on cuDNN 9.14 on an H100, lengths not multiples
of its tiles included). Everything else (prefill chunks against a cache, packed sequences, decode) stays on our
kernels.
*/
#ifndef M2RNN_ATTENTION_CUDNN_CUH
#define M2RNN_ATTENTION_CUDNN_CUH

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "attention_kernels.cuh"

#define CUDNN_ATTN_WHY 320 // room for the reason a shape stays on our kernels

// 1: bitwise-repeatable backward (cuDNN's deterministic graph, or ours); 0: cuDNN's dQ by fp32 atomics (the
// default). -1: from M2RNN_DETERMINISTIC (the switch the M²RNN kernels read too) at first use; tests set it.
static int cudnn_deterministic = -1;

#ifdef USE_CUDNN
#include <dlfcn.h>
#include <cudnn_graph.h>

// ----------------------------------------------------------------------------------------------------------------
// the library, opened once

typedef struct {
    int tried, ok;
    size_t version;
    char why[CUDNN_ATTN_WHY];
    size_t (*getVersion)(void);
    const char *(*getErrorString)(cudnnStatus_t);
    void (*getLastErrorString)(char *, size_t);
    cudnnStatus_t (*create)(cudnnHandle_t *);
    cudnnStatus_t (*setStream)(cudnnHandle_t, cudaStream_t);
    cudnnStatus_t (*createDescriptor)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
    cudnnStatus_t (*destroyDescriptor)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
    cudnnStatus_t (*setAttribute)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t,
                                  int64_t, const void *);
    cudnnStatus_t (*getAttribute)(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                  cudnnBackendAttributeType_t, int64_t, int64_t *, void *);
    cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
    cudnnHandle_t handle[16]; // per device, made on first use
} CudnnLib;
static CudnnLib cudnn_lib;

// 1 when cuDNN is usable; else 0 with the reason in cudnn_lib.why
static int cudnn_lib_open(void) {
    CudnnLib *L = &cudnn_lib;
    if (L->tried) { return L->ok; }
    L->tried = 1;
    const char *env = getenv("M2RNN_CUDNN_LIB");
    const char *names[3] = {env, "libcudnn.so.9", "libcudnn.so"};
    void *h = NULL;
    for (int i = 0; i < 3 && h == NULL; i++) {
        if (names[i] != NULL && names[i][0] != '\0') { h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL); }
    }
    if (h == NULL) {
        snprintf(L->why, sizeof(L->why), "libcudnn.so.9 not found (%s); set LD_LIBRARY_PATH or M2RNN_CUDNN_LIB",
                 dlerror());
        return 0;
    }
#define CUDNN_SYM(field, name)                                                                                         \
    *(void **)&L->field = dlsym(h, name);                                                                              \
    if (L->field == NULL) {                                                                                            \
        snprintf(L->why, sizeof(L->why), "libcudnn lacks %s", name);                                                   \
        return 0;                                                                                                      \
    }
    CUDNN_SYM(getVersion, "cudnnGetVersion")
    CUDNN_SYM(getErrorString, "cudnnGetErrorString")
    CUDNN_SYM(getLastErrorString, "cudnnGetLastErrorString")
    CUDNN_SYM(create, "cudnnCreate")
    CUDNN_SYM(setStream, "cudnnSetStream")
    CUDNN_SYM(createDescriptor, "cudnnBackendCreateDescriptor")
    CUDNN_SYM(destroyDescriptor, "cudnnBackendDestroyDescriptor")
    CUDNN_SYM(finalize, "cudnnBackendFinalize")
    CUDNN_SYM(setAttribute, "cudnnBackendSetAttribute")
    CUDNN_SYM(getAttribute, "cudnnBackendGetAttribute")
    CUDNN_SYM(execute, "cudnnBackendExecute")
#undef CUDNN_SYM
    L->version = L->getVersion();
    // 9.10: the engines take −∞ as the mask value; 9.6: the dQ accumulator needs no clearing
    if (L->version < 91000) {
        snprintf(L->why, sizeof(L->why), "cuDNN %zu.%zu is older than 9.10", L->version / 10000,
                 (L->version % 10000) / 100);
        return 0;
    }
    L->ok = 1;
    return 1;
}

static cudnnHandle_t cudnn_handle(void) {
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    if (dev >= 16) {
        snprintf(cudnn_lib.why, sizeof(cudnn_lib.why), "cuDNN handles are kept for devices 0-15 (this is device %d)", dev);
        return NULL;
    }
    if (cudnn_lib.handle[dev] == NULL) {
        cudnnStatus_t st = cudnn_lib.create(&cudnn_lib.handle[dev]);
        if (st != CUDNN_STATUS_SUCCESS) {
            snprintf(cudnn_lib.why, sizeof(cudnn_lib.why), "cudnnCreate: %s", cudnn_lib.getErrorString(st));
            cudnn_lib.handle[dev] = NULL;
        }
    }
    return cudnn_lib.handle[dev];
}

// ----------------------------------------------------------------------------------------------------------------
// building a graph: every descriptor made is kept (and freed with the plan); the first failure is remembered and
// turns every later call into a no-op

#define CG_MAX_DESC 192
#define CG_MAX_OPS 48

typedef struct {
    cudnnBackendDescriptor_t all[CG_MAX_DESC];
    int n;
    cudnnBackendDescriptor_t ops[CG_MAX_OPS];
    int nops;
    int64_t next_uid; // virtual tensors' ids
    int failed;
    char why[CUDNN_ATTN_WHY];
} CudnnGraph;

typedef struct {
    cudnnBackendDescriptor_t d;
    int64_t dims[4], strides[4];
} CgTensor;

static void cg_fail(CudnnGraph *g, const char *what, cudnnStatus_t st) {
    if (g->failed) { return; }
    g->failed = 1;
    char last[256] = "";
    cudnn_lib.getLastErrorString(last, sizeof(last));
    snprintf(g->why, sizeof(g->why), "%s: %s%s%s", what, cudnn_lib.getErrorString(st), last[0] ? " — " : "", last);
}

static cudnnBackendDescriptor_t cg_new(CudnnGraph *g, cudnnBackendDescriptorType_t type) {
    if (g->failed) { return NULL; }
    if (g->n == CG_MAX_DESC) {
        g->failed = 1;
        snprintf(g->why, sizeof(g->why), "graph too large");
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = cudnn_lib.createDescriptor(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        cg_fail(g, "cudnnBackendCreateDescriptor", st);
        return NULL;
    }
    g->all[g->n++] = d;
    return d;
}

static void cg_set(CudnnGraph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                   cudnnBackendAttributeType_t type, int64_t count, const void *value, const char *what) {
    if (g->failed) { return; }
    cudnnStatus_t st = cudnn_lib.setAttribute(d, name, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) { cg_fail(g, what, st); }
}

static void cg_finalize(CudnnGraph *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->failed) { return; }
    cudnnStatus_t st = cudnn_lib.finalize(d);
    if (st != CUDNN_STATUS_SUCCESS) { cg_fail(g, what, st); }
}

static void cg_op(CudnnGraph *g, cudnnBackendDescriptor_t op) {
    if (g->failed) { return; }
    if (g->nops == CG_MAX_OPS) {
        g->failed = 1;
        snprintf(g->why, sizeof(g->why), "too many operations");
        return;
    }
    g->ops[g->nops++] = op;
}

// a tensor of nd dims (4; a by-value scalar too: the backend wants a pointwise op's operands of one rank); uid 0 =
// virtual (an id is assigned)
static CgTensor cg_tensor(CudnnGraph *g, int64_t uid, cudnnDataType_t dt, int nd, const int64_t *dims,
                          const int64_t *strides, int by_value) {
    CgTensor t;
    memset(&t, 0, sizeof(t));
    for (int i = 0; i < nd; i++) { t.dims[i] = dims[i]; t.strides[i] = strides[i]; }
    const bool is_virtual = uid == 0, is_by_value = by_value != 0;
    if (is_virtual) { uid = g->next_uid++; }
    const int64_t align = 16;
    t.d = cg_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    cg_set(g, t.d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    cg_set(g, t.d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, dims, "tensor dims");
    cg_set(g, t.d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, strides, "tensor strides");
    cg_set(g, t.d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor id");
    cg_set(g, t.d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    cg_set(g, t.d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (is_by_value) { cg_set(g, t.d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &is_by_value, "by value"); }
    cg_finalize(g, t.d, "tensor");
    return t;
}
static CgTensor cg_virtual(CudnnGraph *g, cudnnDataType_t dt, const int64_t *dims, const int64_t *strides) {
    return cg_tensor(g, 0, dt, 4, dims, strides, 0);
}
static CgTensor cg_scalar(CudnnGraph *g, int64_t uid) {
    const int64_t ones[4] = {1, 1, 1, 1};
    return cg_tensor(g, uid, CUDNN_DATA_FLOAT, 4, ones, ones, 1);
}

// y = mode(x[, b[, t]]) computed in `prec`; axis for GEN_INDEX (else −1)
static void cg_pointwise(CudnnGraph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, const CgTensor *x,
                         const CgTensor *b, const CgTensor *t, const CgTensor *y, int64_t axis) {
    cudnnBackendDescriptor_t pw = cg_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    cg_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    cg_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
    if (axis >= 0) { cg_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis"); }
    cg_finalize(g, pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = cg_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    cg_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pw desc");
    cg_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x->d, "pw x");
    if (b != NULL) { cg_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->d, "pw b"); }
    if (t != NULL) { cg_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t->d, "pw t"); }
    cg_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y->d, "pw y");
    cg_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, "pw alpha1");
    cg_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, "pw alpha2");
    cg_finalize(g, op, "pointwise operation");
    cg_op(g, op);
}

// c = a·b (batched over the first two dims, broadcast where a or b has fewer heads), fp32 accumulation
static void cg_matmul(CudnnGraph *g, const CgTensor *a, const CgTensor *b, const CgTensor *c) {
    cudnnBackendDescriptor_t mm = cg_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cg_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "matmul compute type");
    cg_finalize(g, mm, "matmul descriptor");
    cudnnBackendDescriptor_t op = cg_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    cg_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a->d, "matmul a");
    cg_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b->d, "matmul b");
    cg_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c->d, "matmul c");
    cg_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul desc");
    cg_finalize(g, op, "matmul operation");
    cg_op(g, op);
}

// y = reduce(x) over the dims where y has extent 1
static void cg_reduce(CudnnGraph *g, cudnnReduceTensorOp_t mode, const CgTensor *x, const CgTensor *y) {
    cudnnBackendDescriptor_t rd = cg_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cg_set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction mode");
    cg_set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, "reduction compute type");
    cg_finalize(g, rd, "reduction descriptor");
    cudnnBackendDescriptor_t op = cg_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    cg_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x->d, "reduction x");
    cg_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y->d, "reduction y");
    cg_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction desc");
    cg_finalize(g, op, "reduction operation");
    cg_op(g, op);
}

// y = x viewed with other dims/strides (a transpose here)
static void cg_reshape(CudnnGraph *g, const CgTensor *x, const CgTensor *y) {
    cudnnBackendDescriptor_t op = cg_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    cg_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x->d, "reshape x");
    cg_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y->d, "reshape y");
    cg_finalize(g, op, "reshape operation");
    cg_op(g, op);
}

// out (a kv-head tensor) = a·b; grouped (GQA): the product per query head (dims, strides), then summed over each kv
// head's group of query heads
static void cg_matmul_kv(CudnnGraph *g, const CgTensor *a, const CgTensor *b, const CgTensor *out, int grouped,
                         const int64_t *dims, const int64_t *strides) {
    if (!grouped) {
        cg_matmul(g, a, b, out);
        return;
    }
    CgTensor full = cg_virtual(g, CUDNN_DATA_BFLOAT16, dims, strides);
    cg_matmul(g, a, b, &full);
    cg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, &full, out);
}

// y = x where row index ≥ column index (the causal mask, top-left aligned), else −∞ (tensor neg_inf)
static void cg_causal_mask(CudnnGraph *g, const CgTensor *x, const CgTensor *neg_inf, const CgTensor *y) {
    CgTensor row = cg_virtual(g, CUDNN_DATA_INT32, x->dims, x->strides);
    CgTensor col = cg_virtual(g, CUDNN_DATA_INT32, x->dims, x->strides);
    CgTensor keep = cg_virtual(g, CUDNN_DATA_BOOLEAN, x->dims, x->strides);
    cg_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, &row, 2);
    cg_pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, &col, 3);
    cg_pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, &row, &col, NULL, &keep, -1);
    cg_pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf, &keep, y, -1);
}

// ----------------------------------------------------------------------------------------------------------------
// the two graphs. Tensor ids of the variant pack:
enum {
    CU_Q = 1, CU_K, CU_V, CU_O, CU_STATS, CU_SCALE, CU_NEG_INF, CU_DO, CU_DQ, CU_DK, CU_DV, CU_SUM, CU_ONE, CU_DQ_ACC,
    CU_FIRST_VIRTUAL = 100
};

typedef struct {
    int64_t B, NH, NKV, L, HS;
    int64_t q[4], kt[4], vt[4], v[4], o[4]; // strides of Q (B,NH,L,HS), Kᵀ (B,NKV,HS,L), Vᵀ, V (B,NKV,L,HS), O
} CuShape;

static CuShape cu_shape(const AttnDims *d) {
    CuShape s;
    s.B = d->B; s.NH = d->NH; s.NKV = d->NKV; s.L = d->Lq; s.HS = d->HS;
    const int64_t q[4] = {d->q_seq, d->HS, d->q_row, 1}, kt[4] = {d->k_seq, d->HS, 1, d->k_row};
    const int64_t vt[4] = {d->v_seq, d->HS, 1, d->v_row}, v[4] = {d->v_seq, d->HS, d->v_row, 1};
    const int64_t o[4] = {d->o_seq, d->HS, d->o_row, 1};
    memcpy(s.q, q, sizeof(q)); memcpy(s.kt, kt, sizeof(kt)); memcpy(s.vt, vt, sizeof(vt));
    memcpy(s.v, v, sizeof(v)); memcpy(s.o, o, sizeof(o));
    return s;
}

static void cu_build_forward(CudnnGraph *g, const CuShape *s) {
    const int64_t B = s->B, NH = s->NH, NKV = s->NKV, L = s->L, HS = s->HS;
    const int64_t qd[4] = {B, NH, L, HS}, ktd[4] = {B, NKV, HS, L}, vd[4] = {B, NKV, L, HS};
    const int64_t sd[4] = {B, NH, L, L}, ss[4] = {NH * L * L, L * L, L, 1};
    const int64_t rd[4] = {B, NH, L, 1}, rs[4] = {NH * L, L, 1, 1};
    CgTensor Q = cg_tensor(g, CU_Q, CUDNN_DATA_BFLOAT16, 4, qd, s->q, 0);
    CgTensor KT = cg_tensor(g, CU_K, CUDNN_DATA_BFLOAT16, 4, ktd, s->kt, 0);
    CgTensor V = cg_tensor(g, CU_V, CUDNN_DATA_BFLOAT16, 4, vd, s->v, 0);
    CgTensor O = cg_tensor(g, CU_O, CUDNN_DATA_BFLOAT16, 4, qd, s->o, 0);
    CgTensor stats = cg_tensor(g, CU_STATS, CUDNN_DATA_FLOAT, 4, rd, rs, 0);
    CgTensor scale = cg_scalar(g, CU_SCALE), neg_inf = cg_scalar(g, CU_NEG_INF);
    CgTensor S = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss), S1 = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    CgTensor S2 = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss), S3 = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    CgTensor E = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss), P = cg_virtual(g, CUDNN_DATA_BFLOAT16, sd, ss);
    CgTensor M = cg_virtual(g, CUDNN_DATA_FLOAT, rd, rs), Z = cg_virtual(g, CUDNN_DATA_FLOAT, rd, rs);
    CgTensor logZ = cg_virtual(g, CUDNN_DATA_FLOAT, rd, rs);
    cg_matmul(g, &Q, &KT, &S);
    cg_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, &S, &scale, NULL, &S1, -1);
    cg_causal_mask(g, &S1, &neg_inf, &S2);
    cg_reduce(g, CUDNN_REDUCE_TENSOR_MAX, &S2, &M);
    cg_pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, &S2, &M, NULL, &S3, -1);
    cg_pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, &S3, NULL, NULL, &E, -1);
    cg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, &E, &Z);
    cg_pointwise(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, &Z, NULL, NULL, &logZ, -1);
    cg_pointwise(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, &M, &logZ, NULL, &stats, -1);
    cg_pointwise(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, &E, &Z, NULL, &P, -1);
    cg_matmul(g, &P, &V, &O);
}

// accumulate = 1: dQ through cuDNN's fp32 accumulator (tensor CU_DQ_ACC, (B,NH,L,HS) contiguous)
static void cu_build_backward(CudnnGraph *g, const CuShape *s, int accumulate) {
    const int64_t B = s->B, NH = s->NH, NKV = s->NKV, L = s->L, HS = s->HS;
    const int64_t qd[4] = {B, NH, L, HS}, ktd[4] = {B, NKV, HS, L}, kd[4] = {B, NKV, L, HS};
    const int64_t sd[4] = {B, NH, L, L}, ss[4] = {NH * L * L, L * L, L, 1}, sts[4] = {NH * L * L, L * L, 1, L};
    const int64_t rd[4] = {B, NH, L, 1}, rs[4] = {NH * L, L, 1, 1};
    const int64_t full[4] = {NH * L * HS, L * HS, HS, 1}; // a contiguous (B,NH,L,HS)
    CgTensor Q = cg_tensor(g, CU_Q, CUDNN_DATA_BFLOAT16, 4, qd, s->q, 0);
    CgTensor KT = cg_tensor(g, CU_K, CUDNN_DATA_BFLOAT16, 4, ktd, s->kt, 0);
    CgTensor VT = cg_tensor(g, CU_V, CUDNN_DATA_BFLOAT16, 4, ktd, s->vt, 0);
    CgTensor O = cg_tensor(g, CU_O, CUDNN_DATA_BFLOAT16, 4, qd, s->o, 0);
    CgTensor dO = cg_tensor(g, CU_DO, CUDNN_DATA_BFLOAT16, 4, qd, s->o, 0);
    CgTensor stats = cg_tensor(g, CU_STATS, CUDNN_DATA_FLOAT, 4, rd, rs, 0);
    CgTensor dQ = cg_tensor(g, CU_DQ, CUDNN_DATA_BFLOAT16, 4, qd, s->q, 0);
    const int64_t k_strides[4] = {s->kt[0], s->kt[1], s->kt[3], s->kt[2]}; // K (B,NKV,L,HS) from Kᵀ's strides
    const int64_t v_strides[4] = {s->vt[0], s->vt[1], s->vt[3], s->vt[2]};
    CgTensor dK = cg_tensor(g, CU_DK, CUDNN_DATA_BFLOAT16, 4, kd, k_strides, 0);
    CgTensor dV = cg_tensor(g, CU_DV, CUDNN_DATA_BFLOAT16, 4, kd, v_strides, 0);
    CgTensor sum = cg_tensor(g, CU_SUM, CUDNN_DATA_FLOAT, 4, rd, rs, 0);
    CgTensor scale = cg_scalar(g, CU_SCALE), neg_inf = cg_scalar(g, CU_NEG_INF), one = cg_scalar(g, CU_ONE);
    // D = Σ dO∘O
    CgTensor dOO = cg_virtual(g, CUDNN_DATA_FLOAT, qd, s->o), r = cg_virtual(g, CUDNN_DATA_FLOAT, rd, rs);
    cg_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, &dO, &O, NULL, &dOO, -1);
    cg_reduce(g, CUDNN_REDUCE_TENSOR_ADD, &dOO, &r);
    cg_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, &r, &one, NULL, &sum, -1);
    // P = exp(scale·Q·Kᵀ − Stats), masked
    CgTensor S = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss), S1 = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    CgTensor S2 = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss), S3 = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    CgTensor P = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss), PT = cg_virtual(g, CUDNN_DATA_BFLOAT16, sd, sts);
    cg_matmul(g, &Q, &KT, &S);
    cg_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, &S, &scale, NULL, &S1, -1);
    cg_pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, &S1, &stats, NULL, &S2, -1);
    cg_causal_mask(g, &S2, &neg_inf, &S3);
    cg_pointwise(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, &S3, NULL, NULL, &P, -1);
    // dV = Pᵀ·dO (GQA: per query head, then summed over each kv head's group)
    cg_reshape(g, &P, &PT);
    cg_matmul_kv(g, &PT, &dO, &dV, NH != NKV, qd, full);
    // dS = P∘(dO·Vᵀ − D)·scale
    CgTensor dP = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss), dP1 = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    CgTensor dP2 = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss), dS = cg_virtual(g, CUDNN_DATA_FLOAT, sd, ss);
    CgTensor dST = cg_virtual(g, CUDNN_DATA_BFLOAT16, sd, sts);
    cg_matmul(g, &dO, &VT, &dP);
    cg_pointwise(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, &dP, &sum, NULL, &dP1, -1);
    cg_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, &dP1, &P, NULL, &dP2, -1);
    cg_pointwise(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, &dP2, &scale, NULL, &dS, -1);
    // dK = dSᵀ·Q
    cg_reshape(g, &dS, &dST);
    cg_matmul_kv(g, &dST, &Q, &dK, NH != NKV, qd, full);
    // dQ = dS·K
    CgTensor K = cg_virtual(g, CUDNN_DATA_FLOAT, kd, k_strides);
    cg_reshape(g, &KT, &K);
    if (accumulate) {
        CgTensor acc = cg_tensor(g, CU_DQ_ACC, CUDNN_DATA_FLOAT, 4, qd, full, 0);
        cg_matmul(g, &dS, &K, &acc);
        cg_pointwise(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, &acc, NULL, NULL, &dQ, -1);
    } else {
        cg_matmul(g, &dS, &K, &dQ);
    }
}

// ----------------------------------------------------------------------------------------------------------------
// plans: the operation graph, cuDNN's heuristics' engine list, the first engine that builds

typedef struct {
    CudnnGraph g; // the descriptors (kept alive with the plan)
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
    int64_t engine;      // cuDNN's global engine index
    int nondeterministic; // the engine says its results may vary from run to run
} CudnnPlan;

static int cu_plan(CudnnPlan *p, cudnnHandle_t handle) {
    CudnnGraph *g = &p->g;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    cudnnBackendDescriptor_t graph = cg_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    cg_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "graph handle");
    cg_set(g, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops, "graph ops");
    cg_finalize(g, graph, "operation graph");
    cudnnBackendDescriptor_t heur = cg_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cg_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heur graph");
    cg_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heur mode");
    cg_finalize(g, heur, "heuristics");
    if (g->failed) { return 0; }
    int64_t count = 0;
    cudnnStatus_t st = cudnn_lib.getAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                              &count, NULL);
    if (st != CUDNN_STATUS_SUCCESS) { cg_fail(g, "heuristics results", st); return 0; }
    if (count == 0) { snprintf(g->why, sizeof(g->why), "no cuDNN engine for this graph"); g->failed = 1; return 0; }
    if (count > 16) { count = 16; }
    cudnnBackendDescriptor_t cfgs[16];
    for (int i = 0; i < count; i++) { cfgs[i] = cg_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR); }
    if (g->failed) { return 0; }
    int64_t got = 0;
    st = cudnn_lib.getAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs);
    if (st != CUDNN_STATUS_SUCCESS) { cg_fail(g, "heuristics results", st); return 0; }
    char first_why[CUDNN_ATTN_WHY] = "";
    for (int i = 0; i < got; i++) {
        cudnnBackendDescriptor_t plan = cg_new(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        cg_set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "plan handle");
        cg_set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i], "plan cfg");
        if (g->failed) { return 0; }
        st = cudnn_lib.finalize(plan);
        if (st != CUDNN_STATUS_SUCCESS) { // this engine refuses; the next may not
            if (first_why[0] == '\0') {
                char last[200] = "";
                cudnn_lib.getLastErrorString(last, sizeof(last));
                snprintf(first_why, sizeof(first_why), "engine plan: %s %s", cudnn_lib.getErrorString(st), last);
            }
            continue;
        }
        p->plan = plan;
        int64_t n = 0;
        cudnn_lib.getAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &p->workspace);
        cudnnBackendDescriptor_t engine = cg_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
        p->engine = -1;
        if (engine != NULL &&
            cudnn_lib.getAttribute(cfgs[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                   &engine) == CUDNN_STATUS_SUCCESS) {
            cudnn_lib.getAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &p->engine);
            cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
            int64_t nn = 0;
            if (cudnn_lib.getAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                       CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &nn, notes) == CUDNN_STATUS_SUCCESS) {
                for (int j = 0; j < nn; j++) {
                    if (notes[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) { p->nondeterministic = 1; }
                }
            }
        }
        return 1;
    }
#pragma GCC diagnostic pop
    snprintf(g->why, sizeof(g->why), "no engine built a plan (%s)", first_why);
    g->failed = 1;
    return 0;
}

static void cu_plan_free(CudnnPlan *p) {
    for (int i = p->g.n - 1; i >= 0; i--) { cudnn_lib.destroyDescriptor(p->g.all[i]); }
    p->g.n = 0;
    p->plan = NULL;
}

// ----------------------------------------------------------------------------------------------------------------
// the cache of shapes: per (device, dims) the forward and backward plans, or why not

typedef struct {
    int dev;
    AttnDims d; // key: the dims with the pointers (cu_q, cu_k, len_k) NULL
    int ok;
    CudnnPlan fwd, bwd;
    int det;        // key too: built under M2RNN_DETERMINISTIC=1
    int accumulate; // the backward uses the fp32 dQ accumulator (atomics)
    char why[CUDNN_ATTN_WHY]; // why not cuDNN (when !ok)
} CudnnShape;

#define CUDNN_MAX_SHAPES 32
static CudnnShape cudnn_shapes[CUDNN_MAX_SHAPES];
static int cudnn_nshapes;
static void *cudnn_ws[16];      // per device: workspace (plans' workspace + the dQ accumulator)
static size_t cudnn_ws_bytes[16];

static int attention_mode(void) { // 0 ours, 1 auto, 2 cudnn
    static int mode = -1;
    if (mode < 0) {
        const char *e = getenv("M2RNN_ATTENTION");
        mode = 1;
        if (e != NULL && strcmp(e, "ours") == 0) { mode = 0; }
        else if (e != NULL && strcmp(e, "cudnn") == 0) { mode = 2; }
        else if (e != NULL && e[0] != '\0' && strcmp(e, "auto") != 0) {
            fail_with_hint("set M2RNN_ATTENTION to auto, cudnn or ours", "M2RNN_ATTENTION=%s is not a choice", e);
        }
    }
    return mode;
}

static int cudnn_deterministic_on(void) { return env_off_unless_1(&cudnn_deterministic, "M2RNN_DETERMINISTIC"); }

static size_t cu_dq_acc_bytes(const AttnDims *d) { return (size_t)d->B * d->NH * d->Lq * d->HS * sizeof(float); }

// the shape's cache entry, built on first sight
static CudnnShape *cudnn_shape(const AttnDims *d) {
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    AttnDims key = *d;
    key.cu_q = key.cu_k = NULL; key.len_k = NULL;
    for (int i = 0; i < cudnn_nshapes; i++) {
        if (cudnn_shapes[i].dev == dev && cudnn_shapes[i].det == cudnn_deterministic_on() &&
            memcmp(&cudnn_shapes[i].d, &key, sizeof(key)) == 0) {
            return &cudnn_shapes[i];
        }
    }
    if (cudnn_nshapes == CUDNN_MAX_SHAPES) { return NULL; }
    CudnnShape *e = &cudnn_shapes[cudnn_nshapes++];
    memset(e, 0, sizeof(*e));
    e->dev = dev; e->d = key; e->det = cudnn_deterministic_on();
    if (d->cu_q != NULL || d->len_k != NULL || !d->causal || d->Lq != d->Lk || d->Lq < 1) {
        snprintf(e->why, sizeof(e->why), "only causal self-attention of fixed-length sequences goes to cuDNN");
        return e;
    }
    if (!cudnn_lib_open()) { snprintf(e->why, sizeof(e->why), "%s", cudnn_lib.why); return e; }
    cudnnHandle_t h = cudnn_handle();
    if (h == NULL) { snprintf(e->why, sizeof(e->why), "%s", cudnn_lib.why); return e; }
    const CuShape s = cu_shape(d);
    e->fwd.g.next_uid = e->bwd.g.next_uid = CU_FIRST_VIRTUAL;
    cu_build_forward(&e->fwd.g, &s);
    if (e->fwd.g.failed || !cu_plan(&e->fwd, h)) {
        char why[CUDNN_ATTN_WHY - 24]; // room for the prefix
        memcpy(why, e->fwd.g.why, sizeof(why) - 1);
        why[sizeof(why) - 1] = '\0';
        snprintf(e->why, sizeof(e->why), "cuDNN forward: %s", why);
        cu_plan_free(&e->fwd);
        return e;
    }
    // the backward: by default the accumulator form (dQ by fp32 atomics: the fastest, O(T) memory); with
    // M2RNN_DETERMINISTIC=1 the deterministic form, which cuDNN runs with a (B, NH, T, T) bf16 workspace for dP: taken
    // while that fits in a quarter of the GPU's memory, else our deterministic kernels run the shape
    const int det = cudnn_deterministic_on();
    e->det = det;
    e->accumulate = !det;
    cu_build_backward(&e->bwd.g, &s, e->accumulate);
    if (e->bwd.g.failed || !cu_plan(&e->bwd, h)) {
        char why[CUDNN_ATTN_WHY - 40]; // room for the prefix
        memcpy(why, e->bwd.g.why, sizeof(why) - 1);
        why[sizeof(why) - 1] = '\0';
        snprintf(e->why, sizeof(e->why), "cuDNN %sbackward: %s", det ? "deterministic " : "", why);
        cu_plan_free(&e->bwd);
        cu_plan_free(&e->fwd);
        return e;
    }
    size_t total = 0, free_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total));
    if (det && (size_t)e->bwd.workspace > total / 4) {
        snprintf(e->why, sizeof(e->why), "cuDNN's deterministic backward needs %.1f GiB of workspace (over a quarter "
                 "of the GPU's memory)", e->bwd.workspace / 1073741824.0);
        cu_plan_free(&e->bwd);
        cu_plan_free(&e->fwd);
        return e;
    }
    if (e->accumulate) { e->bwd.nondeterministic = 1; } // atomics, whatever the engine's notes say
    // one workspace per device, grown here (at the first step, not inside a captured graph)
    size_t need = (size_t)(e->fwd.workspace > e->bwd.workspace ? e->fwd.workspace : e->bwd.workspace);
    need = (need + 255) / 256 * 256 + (e->accumulate ? cu_dq_acc_bytes(d) : 0);
    if (dev < 16 && need > cudnn_ws_bytes[dev]) {
        if (cudnn_ws[dev] != NULL) { cudaCheck(cudaFree(cudnn_ws[dev])); }
        cudaCheck(cudaMalloc(&cudnn_ws[dev], need));
        cudnn_ws_bytes[dev] = need;
    }
    e->ok = 1;
    return e;
}

static void cu_execute(const CudnnPlan *p, int n, const int64_t *uids, void **ptrs, cudaStream_t stream,
                       const char *what) {
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudnnHandle_t h = cudnn_handle();
    cudnnStatus_t st = cudnn_lib.setStream(h, stream);
    cudnnBackendDescriptor_t pack = NULL;
    if (st == CUDNN_STATUS_SUCCESS) { st = cudnn_lib.createDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack); }
    void *ws = cudnn_ws[dev];
    if (st == CUDNN_STATUS_SUCCESS) {
        st = cudnn_lib.setAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        st = cudnn_lib.setAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        st = cudnn_lib.setAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    }
    if (st == CUDNN_STATUS_SUCCESS) { st = cudnn_lib.finalize(pack); }
    if (st == CUDNN_STATUS_SUCCESS) { st = cudnn_lib.execute(h, p->plan, pack); }
    if (pack != NULL) { cudnn_lib.destroyDescriptor(pack); }
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[256] = "";
        cudnn_lib.getLastErrorString(last, sizeof(last));
        fail_with_hint("run with M2RNN_ATTENTION=ours to use our own attention kernels",
                       "cuDNN attention %s failed: %s %s", what, cudnn_lib.getErrorString(st), last);
    }
}

#endif // USE_CUDNN

// ----------------------------------------------------------------------------------------------------------------
// the interface attention.cuh calls (also built without cuDNN: then it always answers "ours")

// 1 when the training attention of these dims runs on cuDNN (its forward and backward both); else 0 and our kernels
// run it. The first answer of the process is printed (which attention, and why not cuDNN when it is not).
static int cudnn_attention_takes(const AttnDims *d) {
    static int printed = 0;
#ifdef USE_CUDNN
    const int mode = attention_mode();
    if (mode == 0) {
        if (!printed) { printf("attention: our flash kernels (M2RNN_ATTENTION=ours)\n"); printed = 1; }
        return 0;
    }
    CudnnShape *e = cudnn_shape(d);
    const int ok = e != NULL && e->ok;
    if (!ok && mode == 2) {
        fail_with_hint("install cuDNN ≥ 9.10 (libcudnn.so.9 on LD_LIBRARY_PATH), or unset M2RNN_ATTENTION",
                       "M2RNN_ATTENTION=cudnn but cuDNN cannot run this attention: %s",
                       e != NULL ? e->why : "too many shapes");
    }
    if (!printed) {
        if (ok) {
            printf("attention: cuDNN %zu.%zu.%zu fused flash attention (engines %lld forward, %lld backward; %s)\n",
                   cudnn_lib.version / 10000, (cudnn_lib.version % 10000) / 100, cudnn_lib.version % 100,
                   (long long)e->fwd.engine, (long long)e->bwd.engine,
                   e->bwd.nondeterministic ? "dQ by fp32 atomics, not bitwise repeatable: M2RNN_DETERMINISTIC=1 "
                                             "for repeatable steps" : "deterministic");
        } else {
            printf("attention: our flash kernels (cuDNN not used: %s)\n", e != NULL ? e->why : "too many shapes");
        }
        printed = 1;
    }
    return ok;
#else
    if (!printed) { printf("attention: our flash kernels (built without cuDNN headers)\n"); printed = 1; }
    return 0;
#endif
}

// why cuDNN does not take these dims ("" when it does)
static const char *cudnn_attention_why(const AttnDims *d) {
#ifdef USE_CUDNN
    if (attention_mode() == 0) { return "M2RNN_ATTENTION=ours"; }
    CudnnShape *e = cudnn_shape(d);
    return e == NULL ? "too many shapes" : e->ok ? "" : e->why;
#else
    return "built without cuDNN headers";
#endif
}

// 1 when the backward of these (cuDNN-taken) dims is bitwise repeatable
static int cudnn_attention_deterministic(const AttnDims *d) {
#ifdef USE_CUDNN
    CudnnShape *e = cudnn_shape(d);
    return e != NULL && e->ok && !e->bwd.nondeterministic;
#else
    return 1;
#endif
}

// o (rows of d->o_row) and lse (B, NH, L) fp32 from q, k, v (rows as AttnDims); only after cudnn_attention_takes(d)
static void cudnn_attention_forward(__nv_bfloat16 *o, float *lse, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                    const __nv_bfloat16 *v, const AttnDims *d, cudaStream_t stream) {
#ifdef USE_CUDNN
    CudnnShape *e = cudnn_shape(d);
    float scale = d->scale, neg_inf = -INFINITY;
    const int64_t uids[7] = {CU_Q, CU_K, CU_V, CU_O, CU_STATS, CU_SCALE, CU_NEG_INF};
    void *ptrs[7] = {(void *)q, (void *)k, (void *)v, (void *)o, (void *)lse, &scale, &neg_inf};
    cu_execute(&e->fwd, 7, uids, ptrs, stream, "forward");
#else
    fail_with_hint("this is a bug: report it", "cudnn_attention_forward called in a build without cuDNN");
#endif
}

// dq, dk, dv (rows as q, k, v) and D (B, NH, L) fp32 (Σ dO∘O, scratch) from dout (rows as o), the forward's o and
// lse; only after cudnn_attention_takes(d)
static void cudnn_attention_backward(__nv_bfloat16 *dq, __nv_bfloat16 *dk, __nv_bfloat16 *dv, float *D,
                                     const __nv_bfloat16 *dout, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                     const __nv_bfloat16 *v, const __nv_bfloat16 *o, const float *lse,
                                     const AttnDims *d, cudaStream_t stream) {
#ifdef USE_CUDNN
    CudnnShape *e = cudnn_shape(d);
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    float scale = d->scale, neg_inf = -INFINITY, one = 1.0f;
    // the dQ accumulator sits after the plans' workspace
    const size_t ws_plan = ((size_t)(e->fwd.workspace > e->bwd.workspace ? e->fwd.workspace : e->bwd.workspace) +
                            255) / 256 * 256;
    void *acc = (char *)cudnn_ws[dev] + ws_plan;
    const int64_t uids[14] = {CU_Q, CU_K, CU_V, CU_O, CU_DO, CU_STATS, CU_SCALE, CU_NEG_INF, CU_ONE, CU_SUM,
                              CU_DQ, CU_DK, CU_DV, CU_DQ_ACC};
    void *ptrs[14] = {(void *)q, (void *)k, (void *)v, (void *)o, (void *)dout, (void *)lse, &scale, &neg_inf, &one,
                      D, dq, dk, dv, acc};
    cu_execute(&e->bwd, e->accumulate ? 14 : 13, uids, ptrs, stream, "backward");
#else
    fail_with_hint("this is a bug: report it", "cudnn_attention_backward called in a build without cuDNN");
#endif
}

#endif // M2RNN_ATTENTION_CUDNN_CUH
