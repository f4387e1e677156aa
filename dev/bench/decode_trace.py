"""
decode_trace.py: a decode step's timeline from build/bench_infer_trace's records (cuda_common.h, M2RNN_TRACE): one
record per block of every kernel that waits on the kernel before it, written by the block's first thread.

    make build/bench_infer_trace
    M2RNN_TRACE_FILE=trace.bin build/bench_infer_trace d1024:MMMMAMMMMMMMAMMMMMMMAMMM:n84 100352 -graph 1 1024
    python3 dev/bench/decode_trace.py trace.bin [-steps]

Kernels are ordered and grouped by the globaltimer (32 ns steps, one clock for the whole GPU) at which their blocks
left the wait: a kernel's blocks leave it only after the kernel before has completed, so the groups never interleave
(a group is one fingerprint, grid and dynamic shared memory, each block once). Durations inside a block come from its
SM's clock64. A step runs from the kernel after one LM head (the 264-block streamed GEMV) to the next. Per kernel:
  share   its first wait's end to the next kernel's: the step's time this kernel holds on the chain
  lat     its last warp's end to the next kernel's first wait's end (completion → release)
  spread  its blocks' wait ends, first to last
  pro     wait → input rows ready (trace_rows), the slowest block; body: rows ready → last warp's end
  margin  the next kernel's release minus the arrival of its last block at the wait (> 0: it was waiting, ready)
and for the norm products the prologue's parts (trace_mark 0, 1, 2): the rows (gated, or x + branch) by the block,
the norm weight's wait and barrier, warp 0's norm, the second barrier. Averages over the complete steps recorded.
Pure Python (no numpy), so it runs wherever the trace lands.
"""
import collections
import statistics as st
import struct
import sys

REC = 128  # bytes a TraceRec: 16 u64


def load(path):
    raw = open(path, 'rb').read()
    recs = [struct.unpack_from('<16Q', raw, i) for i in range(0, len(raw), REC)]
    return sorted((r for r in recs if r[0]), key=lambda r: r[2])


def kernels(recs):
    ks, cur = [], None
    for r in recs:
        tag = r[0]
        fp, blk = (tag & 0xfffff, (tag >> 40) * 16), (tag >> 20) & 0xfffff
        if cur is None or cur['fp'] != fp or blk in cur['blks']:
            cur = dict(fp=fp, blks=set(), rs=[])
            ks.append(cur)
        cur['blks'].add(blk)
        cur['rs'].append(r)
    return ks


def us(v):
    return '%6.2f' % (v / 1000) if v is not None else '     -'


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def main():
    recs = load(sys.argv[1])
    show_steps = '-steps' in sys.argv
    # the SMs' clock rate: clock64 against the globaltimer over each SM's span of records
    bysm = collections.defaultdict(list)
    for r in recs:
        bysm[r[7]].append(r)
    rates = [(rs[-1][4] - rs[0][4]) / (rs[-1][2] - rs[0][2]) for rs in bysm.values() if rs[-1][2] - rs[0][2] > 1e6]
    f = st.median(rates)  # clocks a ns
    ks = kernels(recs)
    print('%d records, %d kernel instances, SM clock %.3f GHz' % (len(recs), len(ks), f))
    for k in ks:
        rs = k['rs']
        k['w0'], k['w1'] = min(r[2] for r in rs), max(r[2] for r in rs)
        k['pre1'] = max(r[1] for r in rs)
        k['pro'] = [(r[5] - r[4]) / f for r in rs if r[5]]
        k['body'] = [(r[6] - r[5]) / f for r in rs if r[6] and r[5]]
        ends = [r[9] for r in rs if r[9]]
        k['end'] = max(ends) if ends else None
        k['parts'] = [((r[10] - r[4]) / f, (r[11] - r[10]) / f, (r[12] - r[11]) / f, (r[5] - r[12]) / f)
                      for r in rs if r[10] and r[11] and r[12] and r[5]]
    heads = [i for i, k in enumerate(ks) if k['fp'][0] == 264]
    agg = collections.defaultdict(lambda: collections.defaultdict(list))
    nsteps, total = 0, 0.0
    for h0, h1 in zip(heads, heads[1:]):
        if h1 + 1 >= len(ks):
            break
        nsteps += 1
        a, b = h0 + 1, h1 + 1
        total += ks[b]['w0'] - ks[a]['w0']
        if show_steps and nsteps == 1:
            print('step 1: %d kernels, %.1f us\n  i  grid smemKB  share    lat spread    pro   body margin' %
                  (b - a, (ks[b]['w0'] - ks[a]['w0']) / 1000))
        for pos, i in enumerate(range(a, b)):
            k, n = ks[i], ks[i + 1]
            row = dict(share=n['w0'] - k['w0'], lat=n['w0'] - k['end'] if k['end'] else None,
                       spread=k['w1'] - k['w0'], pro=max(k['pro']) if k['pro'] else None,
                       body=max(k['body']) if k['body'] else None, margin=n['w0'] - n['pre1'])
            for key, v in row.items():
                if v is not None:
                    agg[k['fp']][key].append(v)
            for p in k['parts']:
                agg[k['fp']]['parts'].append(p)
            if show_steps and nsteps == 1:
                print('%3d %5d %6.1f %s %s %s %s %s %s' % (pos, k['fp'][0], k['fp'][1] / 1024, us(row['share']),
                      us(row['lat']), us(row['spread']), us(row['pro']), us(row['body']), us(row['margin'])))
    if not nsteps:
        print('no complete step between two LM heads in the records')
        return
    print('%d complete steps, %.1f us a step (the traced build: compare parts, not totals)' % (nsteps, total / nsteps / 1000))
    print(' grid  smem  kernels  share (a step)     lat  spread     pro    body  margin')
    for fp, d in sorted(agg.items(), key=lambda kv: -sum(kv[1]['share'])):
        print('%5d %4.0fKB %8d  %s (%s) %s  %s  %s  %s  %s' % (
            fp[0], fp[1] / 1024, len(d['share']) // nsteps, us(mean(d['share'])), us(sum(d['share']) / nsteps),
            us(mean(d['lat'])), us(mean(d['spread'])), us(mean(d['pro'])), us(mean(d['body'])), us(mean(d['margin']))))
    print('\nnorm products\' prologue, median over blocks (us): rows by the block | weight wait + barrier | '
          'warp 0\'s norm | barrier')
    for fp, d in agg.items():
        if d['parts']:
            cols = list(zip(*d['parts']))
            print('%5d %4.0fKB  %s | %s | %s | %s' % (fp[0], fp[1] / 1024, *(us(st.median(c)) for c in cols)))


if __name__ == '__main__':
    main()
