#!/usr/bin/env python3
"""
plot_logs.py: loss curves from the trainers' main.log files, as one PNG.

usage: python3 dev/plot_logs.py OUT.png LOG_OR_DIR [LOG_OR_DIR ...] [--labels a,b,...]

Each argument is a main.log or a run directory holding one (-o DIR of the trainer). Two panels: the train and
validation losses against the step, and the same against the tokens seen (the log's header lines say the tokens per
step). A run resumed from a checkpoint logs the steps after it again: the last value logged for a step wins, so the
curve is the one of the run as it finally went. Skipped updates (the NaN/outlier guard) are marked with an x.
Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import os
import re
import sys


def read_log(path):
    """-> dict(train={step: loss}, val={step: loss}, skips=[step], tokens_per_step=int or None, name=str)"""
    run = {"train": {}, "val": {}, "skips": [], "tokens_per_step": None, "model": ""}
    with open(path) as f:
        for line in f:
            if line.startswith("#"):
                m = re.search(r"tokens/step (\d+)", line)
                if m:
                    run["tokens_per_step"] = int(m.group(1))
                m = re.search(r"\| model (\S+)", line)
                if m:
                    run["model"] = m.group(1)
                continue
            m = re.match(r"s:(\d+) (trl|tel|skip):(\S+)", line)
            if not m:
                continue
            step, kind, value = int(m.group(1)), m.group(2), m.group(3)
            if kind == "trl":
                run["train"][step] = float(value)
            elif kind == "tel":
                run["val"][step] = float(value)
            else:
                run["skips"].append(step)
                run["train"].pop(step, None)
    return run


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--labels")]
    labels = None
    for a in argv[1:]:
        if a.startswith("--labels"):
            labels = a.split("=", 1)[1].split(",") if "=" in a else None
    if len(args) < 2:
        print(__doc__.strip().split("\n")[2])
        return 2
    out, paths = args[0], args[1:]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("error: matplotlib is not installed\n---> HINT: apt-get install python3-matplotlib", file=sys.stderr)
        return 1
    runs = []
    for i, p in enumerate(paths):
        log = os.path.join(p, "main.log") if os.path.isdir(p) else p
        if not os.path.isfile(log):
            print(f"error: no log at '{log}'\n---> HINT: pass a main.log or the -o directory of a run", file=sys.stderr)
            return 1
        run = read_log(log)
        if not run["train"] and not run["val"]:
            print(f"error: '{log}' holds no loss lines\n---> HINT: pass the main.log of a run", file=sys.stderr)
            return 1
        run["label"] = labels[i] if labels and i < len(labels) else (os.path.basename(os.path.dirname(os.path.abspath(log))) + (f" ({run['model']})" if run["model"] else ""))
        runs.append(run)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, by_tokens in zip(axes, (False, True)):
        for k, run in enumerate(runs):
            color = f"C{k % 10}"
            scale = run["tokens_per_step"] if by_tokens and run["tokens_per_step"] else 1
            for kind, style in (("train", "-"), ("val", "o--")):
                pts = sorted(run[kind].items())
                if pts:
                    ax.plot([s * scale for s, _ in pts], [v for _, v in pts], style, color=color, lw=1.2, ms=3,
                            label=f"{run['label']} {kind}")
            for s in run["skips"]:
                ax.axvline(s * scale, color=color, ls=":", lw=0.8)
        ax.set_xlabel("tokens" if by_tokens else "step")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        if by_tokens and not all(r["tokens_per_step"] for r in runs):
            ax.set_title("tokens (runs without a tokens/step header: by step)", fontsize=9)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out} ({len(runs)} run{'s' if len(runs) > 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
