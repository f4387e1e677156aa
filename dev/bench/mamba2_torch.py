"""mamba2_torch.py: the peer for dev/bench/bench_mamba2.cu: mamba_ssm's mamba_chunk_scan_combined (Triton), run from
the copy carried in .peers/mamba_ssm (git-ignored: scripts/gpu_gdn.sh bench carries it; nothing of it is in the repo).
Same shape (B=8, T=4096, H=32, P=64, N=128, G=1), same timing method as the CUDA bench: CUDA events, 5 warm-ups, the
median of 30. x, B, C, dy bf16; dt fp32 after the softplus (dt_softplus=False, no dt_bias), D (H) fp32, no z.
Chunk sizes 256 (mamba_ssm's Mamba2 default) and 64 (ours). Usage: python3 dev/bench/mamba2_torch.py [B T H P N G]
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
peer = os.path.join(here, '..', '..', '.peers', 'mamba_ssm')
sys.path.insert(0, peer)
try:
    import einops  # noqa: F401
except ImportError:  # the GPU machine may lack einops: a minimal stand-in kept beside the peer copy
    sys.path.insert(0, os.path.join(peer, 'shim'))
import torch
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined


def median_ms(fn, warm=5, reps=30):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    B, T, H, P, N, G = (int(a) for a in sys.argv[1:7]) if len(sys.argv) == 7 else (8, 4096, 32, 64, 128, 1)
    dev = 'cuda'
    torch.manual_seed(0)
    x = (torch.rand(B, T, H, P, device=dev) * 2 - 1).bfloat16().requires_grad_()
    Bm = (torch.rand(B, T, G, N, device=dev) * 2 - 1).bfloat16().requires_grad_()
    Cm = (torch.rand(B, T, G, N, device=dev) * 2 - 1).bfloat16().requires_grad_()
    dt = (0.001 + 0.1 * torch.rand(B, T, H, device=dev)).requires_grad_()
    A = (-(1 + 15 * torch.rand(H, device=dev))).requires_grad_()
    D = torch.ones(H, device=dev).requires_grad_()
    dy = (torch.rand(B, T, H, P, device=dev) * 2 - 1).bfloat16()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  shape B={B} T={T} H={H} P={P} N={N} G={G}")
    for chunk in (256, 64):
        def fwd():
            with torch.no_grad():
                return mamba_chunk_scan_combined(x, dt, A, Bm, Cm, chunk, D=D)

        def fwdbwd():
            y = mamba_chunk_scan_combined(x, dt, A, Bm, Cm, chunk, D=D)
            torch.autograd.grad(y, (x, dt, A, Bm, Cm, D), dy)

        tf, tfb = median_ms(fwd), median_ms(fwdbwd)
        print(f"peer mamba_chunk_scan_combined chunk {chunk}: forward {tf:.3f} ms  forward+backward {tfb:.3f} ms")
        print(f"RESULT peer chunk{chunk} fwd_ms {tf:.3f} fwdbwd_ms {tfb:.3f}")


if __name__ == '__main__':
    main()
