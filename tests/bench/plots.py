#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""plots.py - draw docs/PERFORMANCE.md's plots from the tables in it.

    python3 tests/bench/plots.py [--doc docs/PERFORMANCE.md] [--out docs/perf]

Key idea: the benchmarks write their figures into PERFORMANCE.md as Markdown
tables (tests/bench/run.sh), so the plots are drawn from those same tables
and never disagree with them; rerun this after run.sh. It reads:

  tp_scaling.png      bench_rank's TP tables (this host) and the "TP scaling
                      on 16 CPUs" table (the lent H200 machine): speedup of the
                      rotated walk over the old natural-order LoadQueue
  hit_rate.png        bench_clock's hit rate per policy on each trace, and
                      bench_peer's hit rate against the slot region's size per
                      number of ways (with the exact LRU of the same size)
  fuse_read_size.png  bench_fs's throughput against the read size, per mode

A table that is missing is reported and its plot skipped (exit status 1).
Needs matplotlib (Debian: python3-matplotlib, in packaging/install-deps.sh).
"""
import argparse
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def section(doc, name):
    """The text between <!-- name:begin --> and <!-- name:end -->, or None."""
    m = re.search(r"<!-- %s:begin -->(.*?)<!-- %s:end -->" % (re.escape(name), re.escape(name)),
                  doc, re.S)
    return m.group(1) if m else None


def tables(text):
    """Every Markdown table in text: (the text before it, [header cells], [rows])."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| ]+\|$",
                                                                         lines[i + 1]):
            head = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, j = [], i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip("|").split("|")])
                j += 1
            out.append(("\n".join(lines[max(0, i - 6):i]), head, rows))
            i = j
        else:
            i += 1
    return out


def num(cell):
    """The first number in a cell ('2.11x / 1.01x' -> 2.11, '54.68%' -> 54.68)."""
    m = re.search(r"-?\d+(?:\.\d+)?", cell.replace("**", ""))
    return float(m.group(0)) if m else None


def col(head, *words):
    """Index of the first header cell containing every word."""
    for i, h in enumerate(head):
        if all(w in h for w in words):
            return i
    raise KeyError(" ".join(words))


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    print("wrote", path)


def plot_tp(doc, out):
    rank = section(doc, "bench_rank")
    series = []
    if rank:
        for before, head, rows in tables(rank):
            m = re.search(r"(\d+) x (\d+) KiB shards", before)
            if not m or "N" not in head:
                continue
            n, sp = col(head, "N"), col(head, "rotated speedup vs old")
            series.append(("2 vCPUs, %s KiB shards" % m.group(2),
                           [num(r[n]) for r in rows], [num(r[sp]) for r in rows], "--"))
    for before, head, rows in tables(doc):
        if "TP scaling on 16 CPUs" in before:
            n = col(head, "N")
            for c, h in enumerate(head):
                if "KiB" in h:
                    series.append(("16 CPUs (H200 host), %s" % h.replace(" rotated vs old", ""),
                                   [num(r[n]) for r in rows], [num(r[c]) for r in rows], "-"))
    # A "-" cell (no figure) drops its point.
    series = [(lb, [x for x, y in zip(xs, ys) if x and y], [y for x, y in zip(xs, ys) if x and y],
               ls) for lb, xs, ys, ls in series]
    if not series:
        print("plots.py: no TP scaling tables found", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    top = max(max(s[1]) for s in series)
    ax.plot([1, top], [1, top], color="0.7", lw=1, label="ideal (N)")
    ax.plot([1, top], [0.9, 0.9 * top], color="0.7", lw=1, ls=":", label="target (0.9 x N)")
    for label, xs, ys, ls in series:
        ax.plot(xs, ys, ls, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks([1, 2, 4, 8])
    ax.set_xticklabels(["1", "2", "4", "8"])
    ax.set_yticks([1, 2, 4, 8])
    ax.set_yticklabels(["1x", "2x", "4x", "8x"])
    ax.set_xlabel("ranks N")
    ax.set_ylabel("speedup of the rotated walk over natural order")
    ax.set_title("TP scaling: one task of 256 shards, fault backend 2 ms a load")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, os.path.join(out, "tp_scaling.png"))
    return True


def plot_hit_rate(doc, out):
    clock, peer = section(doc, "bench_clock"), section(doc, "bench_peer")
    ok = True
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    drawn = False
    for _, head, rows in tables(clock or ""):
        if "trace" not in head or "LRU" not in head:
            continue
        pols = [("CLOCK (the cache)", "CLOCK"), ("scan (the cache)", "admission=scan"),
                ("no new-load bit", "CLOCK, no new-load bit"), ("LRU", "exact LRU"),
                ("FIFO", "FIFO")]
        rows = [r for r in rows if "copy a peek" not in r[0] and "release, copy" not in r[0]]
        short = []
        for r in rows:
            t = r[0]
            t = t.replace("capacity keys", "cap keys").replace("batch load + copy, leases held "
                                                                "until copied", "batch + copy")
            short.append(t if len(t) < 44 else t[:42] + "...")
        w = 0.8 / len(pols)
        for k, (h, label) in enumerate(pols):
            c = head.index(h)
            a1.bar([i + (k - (len(pols) - 1) / 2) * w for i in range(len(rows))],
                   [num(r[c]) for r in rows], w, label=label)
        a1.set_xticks(range(len(rows)))
        a1.set_xticklabels(short, rotation=25, ha="right", fontsize=7)
        a1.set_ylabel("hit rate, %")
        a1.set_title("The cache's policies (1024 slots), per trace")
        a1.legend(fontsize=7, ncol=2)
        a1.grid(True, axis="y", alpha=0.3)
        drawn = True
        break
    if not drawn:
        print("plots.py: bench_clock's table not found", file=sys.stderr)
        ok = False
    drawn = False
    for before, head, rows in tables(peer or ""):
        if "load" not in head or "ideal LRU" not in head:
            continue
        for trace, ls in (("uniform", "-"), ("Zipf 0.99", "--")):
            sub = [r for r in rows if r[0] == trace]
            size = [1 / num(r[1]) for r in sub]
            for k, h in enumerate(head[2:]):
                c = head.index(h)
                lru = h == "ideal LRU"
                a2.plot(size, [num(r[c]) * 100 for r in sub], ls, marker="s" if lru else "o",
                        color="black" if lru else "C%d" % k, label="%s, %s" % (trace, h))
        a2.set_xscale("log", base=2)
        a2.set_xticks([0.25, 0.5, 1, 2])
        a2.set_xticklabels(["1/4", "1/2", "1", "2"])
        a2.set_xlabel("slot region size / distinct keys")
        a2.set_ylabel("hit rate, %")
        a2.set_title("Peer slot region: hit rate vs size, per ways")
        a2.legend(fontsize=6, ncol=2)
        a2.grid(True, alpha=0.3)
        drawn = True
        break
    if not drawn:
        print("plots.py: bench_peer's hit-rate table not found", file=sys.stderr)
        ok = False
    save(fig, os.path.join(out, "hit_rate.png"))
    return ok


def plot_hit_rate_size(doc, out):
    """Hit rate against cache size per policy (bench_clock's sweep table)."""
    clock = section(doc, "bench_clock")
    for _, head, rows in tables(clock or ""):
        if "slots" not in head or "FIFO" not in head:
            continue
        traces = []
        for r in rows:
            if r[0] not in traces:
                traces.append(r[0])
        fig, axes = plt.subplots(1, len(traces), figsize=(6 * len(traces), 4.4), squeeze=False)
        for ax, trace in zip(axes[0], traces):
            sub = [r for r in rows if r[0] == trace]
            size = [num(r[1]) for r in sub]
            for k, h in enumerate(head[2:]):
                c = head.index(h)
                ax.plot(size, [num(r[c]) for r in sub], marker="o", color="C%d" % k, label=h)
            ax.set_xscale("log", base=2)
            ax.set_xticks(size)
            ax.set_xticklabels([str(int(s)) for s in size])
            ax.set_xlabel("cache size, slots")
            ax.set_ylabel("hit rate, %")
            ax.set_title(trace)
            ax.legend(fontsize=8)
            ax.grid(True, alpha=0.3)
        save(fig, os.path.join(out, "hit_rate_size.png"))
        return True
    print("plots.py: bench_clock's hit rate against cache size table not found", file=sys.stderr)
    return False


def gbs(cell, size):
    """A bench_fs throughput cell in GB/s ('2.84 GB/s', or '301 k/s' of size-byte reads)."""
    v = num(cell)
    if v is None:
        return None
    if "k/s" in cell:
        return v * 1e3 * size / 1e9
    return v


def plot_fuse(doc, out):
    fs = section(doc, "bench_fs")
    for _, head, rows in tables(fs or ""):
        if "workload" not in head or "tmpfs" not in head:
            continue
        by = {r[0]: r for r in rows}
        random = [("4 KiB random reads, 1 job", 4096), ("1 MiB reads, random, 1 job", 1 << 20)]
        seq = [("`cat` of every shard file", 128 << 10),
               ("1 MiB reads, sequential, 1 job", 1 << 20)]
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        modes = (("tmpfs", "C0"), ("passthrough_ll", "C1"), ("shardfs default", "C2"),
                 ("shardfs page_cache", "C3"))
        for mode, color in modes:
            c = head.index(mode)
            for rowset, ls, what in ((random, "-", "random"), (seq, "--", "sequential")):
                pts = [(size, gbs(by[w][c], size)) for w, size in rowset if w in by]
                pts = [p for p in pts if p[1] is not None]
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o",
                            color=color, label="%s, %s" % (mode, what))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks([4096, 128 << 10, 1 << 20])
        ax.set_xticklabels(["4 KiB", "128 KiB\n(cat)", "1 MiB"])
        ax.set_xlabel("read size (one job)")
        ax.set_ylabel("GB/s")
        ax.set_title("FUSE reads of resident shards: read size vs throughput")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
        save(fig, os.path.join(out, "fuse_read_size.png"))
        return True
    print("plots.py: bench_fs's table not found", file=sys.stderr)
    return False


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--doc", default=os.path.join(root, "docs", "PERFORMANCE.md"))
    ap.add_argument("--out", default=os.path.join(root, "docs", "perf"))
    a = ap.parse_args()
    with open(a.doc, encoding="utf-8") as f:
        doc = f.read()
    os.makedirs(a.out, exist_ok=True)
    ok = [plot_tp(doc, a.out), plot_hit_rate(doc, a.out), plot_hit_rate_size(doc, a.out),
          plot_fuse(doc, a.out)]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
