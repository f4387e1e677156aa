"""
attention_torch.py: the peer of bench_attention.cu in the same call: PyTorch's scaled_dot_product_attention with
its flash and cuDNN backends, causal, bf16, at the issue's shapes (B=8, H=16, HS in {64,128}, T in {1024,4096,16384}),
forward (no grad) and forward+backward. Timing: CUDA events, 3 warm-up calls, median of 20. FLOPs as in
bench_attention.cu: forward 2·B·H·T²·HS (causal), forward+backward 3.5× that.

  python3 dev/bench/attention_torch.py
"""
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend


def median_ms(fn, repeats=20):
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    B, H = 8, 16
    for HS in (64, 128):
        for T in (1024, 4096, 16384):
            q, k, v = (torch.randn(B, H, T, HS, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            g = torch.randn(B, H, T, HS, device="cuda", dtype=torch.bfloat16)
            flops = 2.0 * B * H * T * T * HS
            for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                try:
                    with sdpa_kernel(backend):
                        with torch.no_grad():
                            fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

                        def step():
                            o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
                            o.backward(g)
                        both = median_ms(step)
                    print(f"{name:6s} B={B} H={H} HS={HS:3d} T={T:5d}  fwd {fwd:8.3f} ms {flops / fwd / 1e9:6.1f} TFLOP/s"
                          f"   fwd+bwd {both:8.3f} ms {3.5 * flops / both / 1e9:6.1f} TFLOP/s")
                except RuntimeError as e:
                    print(f"{name:6s} B={B} H={H} HS={HS:3d} T={T:5d}  refused: {str(e).splitlines()[0][:100]}")
            del q, k, v, g
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
