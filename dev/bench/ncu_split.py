"""
ncu_split.py: the per-kernel split of one training step from an Nsight Compute CSV (gpu__time_duration.sum of every
kernel, `ncu --metrics gpu__time_duration.sum --csv --print-units base`): kernels grouped by name, total ms, launches,
share, largest first, as a markdown table. scripts/gpu_attention.sh writes the CSV.

  python3 dev/bench/ncu_split.py ncu.csv [top]      the kernels, largest first
  python3 dev/bench/ncu_split.py ncu.csv groups     grouped by what they do
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*$", "", name)               # arguments
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"<.*>$", lambda m: m.group(0) if len(m.group(0)) < 40 else "<...>", name)
    return name


GROUPS = [  # (group, name prefixes), first match wins
    ("attention, cuDNN (fused fwd, bwd)", ("sdpa", "fmha", "cudnn")),
    ("attention (flash fwd, dkdv, dq, D)", ("flash_",)),
    ("attention, materialized (softmax, permutes)", ("causal_softmax", "attention_permute", "attention_unpermute")),
    ("RoPE", ("attention_rope", "rope_table")),
    ("matmuls (cuBLASLt)", ("nvjet", "cutlass", "sm90_", "cublasLt::", "gemm")),
    ("GDN chunked recurrence, q/k L2 norm, GDN gates", ("gdn_", "l2norm")),
    ("Mamba-2 chunked recurrence", ("mamba2",)),
    ("M2RNN recurrence; conv and gates of every mixer", ("m2rnn", "conv", "gate", "dconv")),
    ("RMSNorm", ("rmsnorm",)),
    ("SwiGLU", ("swiglu",)),
    ("classifier (cross-entropy)", ("crossentropy",)),
    ("AdamW, grad norm", ("adamw", "sum_squares", "sum_partials")),
    ("embedding", ("embedding",)),
]


def group_of(name):
    for g, prefixes in GROUPS:
        if any(name.startswith(p) or p in name for p in prefixes):
            return g
    return "other"


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "groups" else 40
    groups = "groups" in sys.argv[2:]
    total, launches = defaultdict(float), defaultdict(int)
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "ns")
        scale = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3}
        v = float(row["Metric Value"].replace(",", "")) * scale.get(unit, 1e-6)
        k = short(row["Kernel Name"])
        total[k] += v
        launches[k] += 1
    s = sum(total.values())
    if groups:
        gt, gl = defaultdict(float), defaultdict(int)
        for k, v in total.items():
            gt[group_of(k)] += v
            gl[group_of(k)] += launches[k]
        print("| kernels | launches | ms | share |")
        print("|---|---|---|---|")
        for g, v in sorted(gt.items(), key=lambda kv: -kv[1]):
            print(f"| {g} | {gl[g]} | {v:.1f} | {100 * v / s:.1f}% |")
        print(f"| all | {sum(launches.values())} | {s:.1f} | 100% |")
        return
    print(f"| kernel | launches | ms | share |")
    print("|---|---|---|---|")
    for k, v in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| `{k}` | {launches[k]} | {v:.2f} | {100 * v / s:.1f}% |")
    print(f"| all ({sum(launches.values())} launches) | | {s:.2f} | 100% |")


if __name__ == "__main__":
    main()
