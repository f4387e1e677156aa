"""
m2rnn_authors.py: runs the authors' Triton M²RNN kernel (xma.layers.m2rnn.op.m2rnn, open-lm-engine/
accelerated-model-architectures) beside ours, for dev/bench/m2rnn_results.md. The authors' package is NOT part of this
repo: scripts/gpu_m2rnn.sh puts a trimmed copy (kept in .peers/, git-ignored) on PYTHONPATH.

  python3 dev/bench/m2rnn_authors.py bench [--reps 20]   time their forward and forward+backward at the paper's shapes
  python3 dev/bench/m2rnn_authors.py compare DIR         DIR from `build/bench_m2rnn -d DIR`: run their kernel on the
                                                         same inputs, compute a float64 reference, and print the
                                                         relative error of ours and theirs per window of t

Their kernel takes bf16 f and h0 (training casts them); the dumped inputs are bf16-representable, so both kernels see
identical values. Their op has no d(final state) clamp semantics to compare here, so `compare` runs with the clamp off.
"""

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # xma asks jax for its backend; keep jax off the GPU
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np
import torch

from xma.accelerator import KernelBackend
from xma.layers.m2rnn.op import m2rnn as authors_m2rnn


def run_authors(q, k, v, W, f, h0=None, dy=None, dht=None, backward=True):
    y, ht = authors_m2rnn(q, k, v, W, f, h0, None, kernel_backend=KernelBackend.triton)
    if backward:
        grads = [dy] + ([dht] if dht is not None else [])
        outs = [y] + ([ht] if dht is not None else [])
        torch.autograd.backward(outs, grads)
    return y, ht


def median_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def bench(reps):
    dev = "cuda"
    print(f"authors' kernel on {torch.cuda.get_device_name(0)}, torch {torch.__version__}", flush=True)
    for B, N in [(4, 84), (8, 84), (4, 132), (8, 132)]:
        T, K, V = 4096, 64, 16
        g = torch.Generator(device=dev).manual_seed(0)
        silu = torch.nn.functional.silu
        q = silu(torch.randn(B, T, 1, K, device=dev, generator=g)).bfloat16().requires_grad_()
        k = silu(torch.randn(B, T, 1, K, device=dev, generator=g)).bfloat16().requires_grad_()
        v = silu(torch.randn(B, T, N, V, device=dev, generator=g)).bfloat16().requires_grad_()
        W = (0.7 * torch.eye(V, device=dev) + 0.05 * torch.randn(N, V, V, device=dev, generator=g)).bfloat16()
        W.requires_grad_()
        f = torch.sigmoid(1.5 + 2 * torch.randn(B, T, N, device=dev, generator=g)).bfloat16().requires_grad_()
        dy = torch.randn(B, T, N, V, device=dev, generator=g).bfloat16()

        def fwd():
            with torch.no_grad():
                authors_m2rnn(q, k, v, W, f, None, 1.0, kernel_backend=KernelBackend.triton)

        def fwd_bwd():
            y, _ = authors_m2rnn(q, k, v, W, f, None, 1.0, kernel_backend=KernelBackend.triton)
            torch.autograd.backward([y], [dy])
            for t in (q, k, v, W, f):
                t.grad = None

        t0 = time.time()
        fwd_bwd()  # first call autotunes (24 configs per kernel)
        torch.cuda.synchronize()
        tune_s = time.time() - t0
        f_ms = median_ms(fwd, reps)
        fb_ms = median_ms(fwd_bwd, reps)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        extra = (torch.cuda.max_memory_allocated() - base) / 2**30
        print(f"authors B={B} T={T} N={N} K={K} V={V} Nq=1 | fwd {f_ms:.3f} ms | fwd+bwd {fb_ms:.3f} ms | "
              f"{B * T / (fb_ms * 1e-3) / 1e6:.2f} Mtok/s fwd+bwd | fwd+bwd peak extra mem {extra:.3f} GiB "
              f"(incl. grads) | first call (autotune) {tune_s:.1f} s", flush=True)
        del q, k, v, W, f, dy
        torch.cuda.empty_cache()


def load(dirname, name, dtype, shape):
    raw = np.fromfile(os.path.join(dirname, name), dtype=np.uint16 if dtype == "bf16" else np.float32)
    t = torch.from_numpy(raw.view(np.int16) if dtype == "bf16" else raw)
    if dtype == "bf16":
        t = t.view(torch.bfloat16)
    return t.reshape(shape).cuda()


def reference_f64(q, k, v, W, f, h0, dy, dhT):
    """float64 forward + backward straight from the equations (no clamp). Shapes: q,k (B,T,K), v (B,T,N,V)."""
    B, T, N, V = v.shape
    H = h0.clone()
    Hs = torch.empty(T + 1, *H.shape, dtype=torch.float64, device=H.device)
    Zs = torch.empty(T, *H.shape, dtype=torch.float64, device=H.device)
    Hs[0] = H
    y = torch.empty(B, T, N, V, dtype=torch.float64, device=H.device)
    for t in range(T):
        X = k[:, t, None, :, None] * v[:, t, :, None, :]  # (B,N,K,V)
        Z = torch.tanh(torch.matmul(H, W) + X)
        ft = f[:, t, :, None, None]
        H = ft * H + (1 - ft) * Z
        Hs[t + 1] = H
        Zs[t] = Z
        y[:, t] = torch.einsum("bnkv,bk->bnv", H, q[:, t])
    G = dhT.clone()
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    df = torch.zeros_like(f)
    dW = torch.zeros_like(W)
    Wt = W.transpose(-1, -2)
    for t in range(T - 1, -1, -1):
        D = G + q[:, t, None, :, None] * dy[:, t, :, None, :]
        ft = f[:, t, :, None, None]
        Z = Zs[t]
        dX = D * (1 - ft) * (1 - Z * Z)
        df[:, t] = (D * (Hs[t] - Z)).sum((-1, -2))
        dq[:, t] = torch.einsum("bnkv,bnv->bk", Hs[t + 1], dy[:, t])
        dk[:, t] = torch.einsum("bnkv,bnv->bk", dX, v[:, t])
        dv[:, t] = torch.einsum("bnkv,bk->bnv", dX, k[:, t])
        dW += torch.einsum("bnkv,bnkj->nvj", Hs[t], dX)
        G = ft * D + torch.matmul(dX, Wt)
    return dict(y=y, hT=H, dq=dq, dk=dk, dv=dv, df=df, dW=dW, dh0=G)


def rel(a, r):
    a = a.double()
    return ((a - r).norm() / r.norm()).item()


def compare(dirname):
    B, T, N, Nq, K, V = [int(x) for x in open(os.path.join(dirname, "meta.txt")).read().split()]
    assert Nq == 1, "the comparison is written for the paper's Nq = 1"
    q = load(dirname, "q.bin", "bf16", (B, T, 1, K))
    k = load(dirname, "k.bin", "bf16", (B, T, 1, K))
    v = load(dirname, "v.bin", "bf16", (B, T, N, V))
    f = load(dirname, "f.bin", "f32", (B, T, N))
    W = load(dirname, "W.bin", "bf16", (N, V, V))
    h0 = load(dirname, "h0.bin", "f32", (B, N, K, V))
    dy = load(dirname, "dy.bin", "bf16", (B, T, N, V))
    dhT = load(dirname, "dhT.bin", "f32", (B, N, K, V))
    ours = dict(
        y=load(dirname, "y.bin", "bf16", (B, T, N, V)), hT=load(dirname, "hT.bin", "f32", (B, N, K, V)),
        dq=load(dirname, "dq.bin", "bf16", (B, T, K)), dk=load(dirname, "dk.bin", "bf16", (B, T, K)),
        dv=load(dirname, "dv.bin", "bf16", (B, T, N, V)), df=load(dirname, "df.bin", "f32", (B, T, N)),
        dW=load(dirname, "dW.bin", "f32", (N, V, V)), dh0=load(dirname, "dh0.bin", "f32", (B, N, K, V)))
    # the authors' kernel, same values (f, h0, dhT are bf16-representable)
    qa, ka, va = (x.clone().requires_grad_() for x in (q, k, v))
    Wa = W.clone().requires_grad_()
    fa = f.bfloat16().requires_grad_()
    h0a = h0.bfloat16().requires_grad_()
    assert torch.equal(fa.float(), f) and torch.equal(h0a.float(), h0)
    y, ht = authors_m2rnn(qa, ka, va, Wa, fa, h0a, None, kernel_backend=KernelBackend.triton)
    torch.autograd.backward([y, ht], [dy, dhT.bfloat16()])
    theirs = dict(y=y.detach(), hT=ht.detach(), dq=qa.grad[:, :, 0], dk=ka.grad[:, :, 0], dv=va.grad,
                  df=fa.grad, dW=Wa.grad, dh0=h0a.grad)
    t0 = time.time()
    ref = reference_f64(q[:, :, 0].double(), k[:, :, 0].double(), v.double(), W.double(), f.double(), h0.double(),
                        dy.double(), dhT.double())
    torch.cuda.synchronize()
    print(f"float64 reference: B={B} T={T} N={N} K={K} V={V} Nq=1 ({time.time() - t0:.1f} s)")
    print("relative L2 error vs float64, whole tensors:")
    print(f"  {'':8s} {'ours':>10s} {'authors':>10s} {'ratio':>7s}")
    all_lower = True
    for name in ["y", "hT", "dq", "dk", "dv", "df", "dW", "dh0"]:
        eo, ea = rel(ours[name], ref[name]), rel(theirs[name], ref[name])
        all_lower &= eo < ea
        print(f"  {name:8s} {eo:10.2e} {ea:10.2e} {ea / eo:7.1f}x")
    window = 512
    print(f"per window of {window} tokens (ours / authors):")
    print("  " + f"{'t0':>6s} " + " ".join(f"{n:>19s}" for n in ["y", "dq", "dk", "dv", "df"]))
    for t0 in range(0, T, window):
        sl = slice(t0, t0 + window)
        cells = []
        for name in ["y", "dq", "dk", "dv", "df"]:
            eo = rel(ours[name][:, sl], ref[name][:, sl])
            ea = rel(theirs[name][:, sl], ref[name][:, sl])
            all_lower &= eo < ea
            cells.append(f"{eo:8.2e} / {ea:8.2e}")
        print(f"  {t0:6d} " + " ".join(f"{c:>19s}" for c in cells))
    print("VERDICT: ours has the lower error on every tensor and every window" if all_lower
          else "VERDICT: ours is NOT lower everywhere (see above)")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "bench":
        reps = int(sys.argv[3]) if len(sys.argv) >= 4 and sys.argv[2] == "--reps" else 20
        bench(reps)
    elif len(sys.argv) == 3 and sys.argv[1] == "compare":
        compare(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(1)
