"""
moe_torch.py: the peer of bench_moe.cu in the same call: one MoE layer of the paper's 7B shape in PyTorch (bf16):
router linear, softmax, top-8 with the softmax over the chosen (normalized top-k), tokens sorted by expert,
torch._grouped_mm for the experts' SwiGLU (a Python loop over experts where _grouped_mm is missing), the weighted
combine with index_add_, the ungated shared expert, the switch load-balancing loss; backward by autograd.
FLOPs, timing and shapes as bench_moe.cu (active FLOPs; forward+backward = 3 × forward; CUDA events, 3 warm-ups,
median of 20).

  python3 dev/bench/moe_torch.py
"""
import torch
import torch.nn.functional as F

from attention_torch import median_ms  # (CUDA events, 3 warm-ups, the median; this folder is on the path)

C, E, K, FH, S = 1536, 128, 8, 256, 1024


class MoE(torch.nn.Module):
    def __init__(self, grouped):
        super().__init__()
        std = 0.02
        self.router = torch.nn.Parameter(torch.randn(E, C) * std)
        self.up = torch.nn.Parameter(torch.randn(E, C, 2 * FH) * std)    # x @ up[e]: (n, 2F) gate | linear
        self.down = torch.nn.Parameter(torch.randn(E, FH, C) * std)
        self.sup = torch.nn.Parameter(torch.randn(2 * S, C) * std)
        self.sdown = torch.nn.Parameter(torch.randn(C, S) * std)
        self.grouped = grouped

    def forward(self, x):
        M = x.shape[0]
        logits = (x @ self.router.t()).float()
        probs = logits.softmax(-1)
        top, idx = logits.topk(K, dim=-1)
        w = top.softmax(-1)
        flat = idx.flatten()
        order = flat.argsort(stable=True)
        tok = order // K
        counts = torch.bincount(flat, minlength=E)
        xs = x[tok]
        if self.grouped:
            offs = counts.cumsum(0).to(torch.int32)
            up = torch._grouped_mm(xs, self.up, offs=offs)
            h = F.silu(up[:, :FH]) * up[:, FH:]
            y = torch._grouped_mm(h, self.down, offs=offs)
        else:
            ys, start = [], 0
            for e, n in enumerate(counts.tolist()):
                if n:
                    u = xs[start:start + n] @ self.up[e]
                    ys.append((F.silu(u[:, :FH]) * u[:, FH:]) @ self.down[e])
                start += n
            y = torch.cat(ys)
        wy = y * w.flatten()[order].unsqueeze(1).to(y.dtype)
        su = x @ self.sup.t()
        out = (F.silu(su[:, :S]) * su[:, S:]) @ self.sdown.t()
        out = out.index_add(0, tok, wy)
        aux = 0.001 * E * (probs.mean(0) * (counts.float() / (M * K))).sum()
        return out, aux


def main():
    print("device:", torch.cuda.get_device_name(), "torch", torch.__version__)
    grouped = hasattr(torch, "_grouped_mm")
    layer = MoE(grouped).cuda().to(torch.bfloat16)
    name = "PyTorch " + ("torch._grouped_mm" if grouped else "loop over experts")
    flops_tok = 2.0 * C * E + K * 6.0 * C * FH + 6.0 * C * S
    print("| layer | tokens | pass | ms | TFLOP/s (active) |\n|---|---|---|---|---|")
    for M in (16384, 32768):
        x = (torch.rand(M, C, device="cuda") * 2 - 1).to(torch.bfloat16).requires_grad_(True)
        g = (torch.rand(M, C, device="cuda") * 2e-3 - 1e-3).to(torch.bfloat16)

        def fwd():
            with torch.no_grad():
                layer(x)

        def both():
            out, aux = layer(x)
            torch.autograd.backward([out, aux], [g, torch.ones_like(aux)])

        f = median_ms(fwd)
        b = median_ms(both)
        flops = flops_tok * M
        print(f"| {name} | {M} | forward | {f:.3f} | {flops / f * 1e-9:.1f} |")
        print(f"| {name} | {M} | forward+backward | {b:.3f} | {3 * flops / b * 1e-9:.1f} |")


if __name__ == "__main__":
    main()
