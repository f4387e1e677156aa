"""gdn_fla.py: the peer of bench_gdn.cu, fla's chunk_gated_delta_rule (Triton) at the same shapes, in the same call
(scripts/gpu_gdn.sh bench): B=8, T=4096; H=2, K=256, V=512 and H=16, K=V=128; bf16; q and k L2-normalized in the
kernel (use_qk_l2norm_in_kernel=True), g the log-decay and beta given, as bench_gdn.cu times ours. Forward and
forward+backward (o.backward with a random gradient), CUDA events, 3 warm-ups, the median of 20.
usage: PYTHONPATH=.peers/fla python3 dev/bench/gdn_fla.py [H K V]   (both shapes unless one is given)
FLA_KERNELS=1 adds fla's per-kernel split of one forward+backward (torch.profiler, the mean of 5), to set beside
bench_gdn's per-kernel medians.
fla comes from a copy kept out of the repository (.peers/fla, from github:fla-org/flash-linear-attention; PYTHONPATH
points at it). Its guard against Triton < 3.7.1 on Hopper (a miscompile of the gated dqkwg backward at block width 64;
at these shapes it takes 128) is lifted, as the issue asks; the gradients are checked against a float32 recurrence on
a short input first, so a miscompile would show.
"""
import sys, types, os
import torch

root = next(p for p in sys.path + [os.environ.get('PYTHONPATH', '')] if p and os.path.isdir(os.path.join(p, 'fla')))
# import only what the op needs: the packages' __init__ files import every op and layer (and einops, transformers)
for name, sub in (('fla', 'fla'), ('fla.ops', 'fla/ops'), ('fla.modules', 'fla/modules'),
                  ('fla.ops.gated_delta_rule', 'fla/ops/gated_delta_rule')):
    m = types.ModuleType(name)
    m.__path__ = [os.path.join(root, sub)]
    m.__version__ = '0.0.0'  # fla.utils reads the package's version
    sys.modules[name] = m
import fla.ops.common.chunk_o as chunk_o
chunk_o.TRITON_ABOVE_3_7_1 = True
from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule


def median_ms(f, repeats=20):
    for _ in range(3):
        f()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(repeats):
        a.record(); f(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def inputs(B, T, H, K, V, dev='cuda', grad=True):
    torch.manual_seed(0)
    q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16, requires_grad=grad)
    k = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16, requires_grad=grad)
    v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16, requires_grad=grad)
    g = (torch.nn.functional.logsigmoid(torch.randn(B, T, H, device=dev)) / 16).requires_grad_(grad)
    beta = torch.rand(B, T, H, device=dev).sigmoid().to(torch.bfloat16).requires_grad_(grad)
    return q, k, v, g, beta


def reference(q, k, v, g, beta):  # float32 recurrence, for the check
    q, k = torch.nn.functional.normalize(q.float(), dim=-1), torch.nn.functional.normalize(k.float(), dim=-1)
    v, beta = v.float(), beta.float()
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], device=q.device)
    out = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum('bhkv,bhk->bhv', S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        out.append(torch.einsum('bhkv,bhk->bhv', S, q[:, t]) * K ** -0.5)
    return torch.stack(out, 1)


print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
q, k, v, g, beta = inputs(1, 200, 2, 128, 128)
o, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
do = torch.randn_like(o)
got = torch.autograd.grad(o, (q, k, v, g, beta), do)
want = torch.autograd.grad(reference(q, k, v, g, beta), (q, k, v, g, beta), do.float())
errs = [((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in zip(got, want)]
print("fla gradient check against a float32 recurrence (dq dk dv dg dbeta):", " ".join(f"{e:.1e}" for e in errs))
shapes = ((2, 256, 512), (16, 128, 128))
if len(sys.argv) == 4:  # one shape (H K V): fla autotunes each shape afresh, minutes on a new machine
    shapes = ((int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])),)
print("| B | T | H | K | V | fla fwd ms | fla fwd+bwd ms |")
print("|---|---|---|---|---|---|---|", flush=True)
for (H, K, V) in shapes:
    B, T = 8, 4096
    q, k, v, g, beta = inputs(B, T, H, K, V)
    do = torch.randn(B, T, H, V, device='cuda', dtype=torch.bfloat16)
    with torch.no_grad():
        fwd = median_ms(lambda: chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True))

    def fb():
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        o.backward(do)
    fwdbwd = median_ms(fb)
    print(f"| {B} | {T} | {H} | {K} | {V} | {fwd:.3f} | {fwdbwd:.3f} |", flush=True)
    if os.environ.get('FLA_KERNELS'):
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fb()
            torch.cuda.synchronize()
        dt = lambda e: getattr(e, 'device_time_total', None) or getattr(e, 'cuda_time_total', 0)  # (torch versions)
        rows = sorted(((e.key, dt(e) / 5 / 1000, e.count // 5) for e in prof.key_averages() if dt(e) > 0),
                      key=lambda r: -r[1])
        for name, ms, n in rows[:16]:
            print(f"  fla kernel {ms:7.3f} ms  x{n}  {name[:90]}")
