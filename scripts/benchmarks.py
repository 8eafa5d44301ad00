#!/usr/bin/env python3
"""Writes BENCHMARKS.md from the programs' own output under benchmarks/<device>/.

Each device folder holds what one sitting on that device wrote:
  meta.json          {"title", "commit", "date", "machine", "command"}
  info.json          `fusegraph info --json`
  roofline*.json     `fusegraph roofline --json PATH` (one or more calls)
  bench.json         `fusegraph bench --json PATH`
  peers.txt          `../shared/peers/compare.sh run 2` (or gpu.sh's peers phase log)
  notes.md           (optional) what the tables show, in a few present-tense lines
GPU folders come first. Usage, from the project root:
  python3 scripts/benchmarks.py            # rewrites BENCHMARKS.md
  python3 scripts/benchmarks.py --check    # exits 1 if BENCHMARKS.md is not up to date
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "BENCHMARKS.md")


def load(path):
    def reject(constant):
        raise ValueError(f"{path}: {constant} is not JSON")

    with open(path) as f:
        # Strict: NaN and Infinity are not JSON.
        return json.load(f, parse_constant=reject)


def fmt(v, digits=3):
    return "—" if v is None else f"{v:.{digits}f}"


def roofline_table(rows):
    out = ["| kernel | dtype | shape | ms | GB/s | % of copy | GFLOP/s |", "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for r in rows:
        pct = 100.0 * r["gbps"] / r["ceiling_gbps"] if r.get("ceiling_gbps") else None
        gflops = r["gflops"] or None
        out.append(
            f"| {r['kernel']} | {r['dtype']} | {r['shape']} | {fmt(r['ms'])} | {r['gbps']:.0f} | "
            f"{'—' if pct is None else f'{pct:.0f}%'} | {'—' if gflops is None else f'{gflops:.0f}'} |"
        )
    return out


def bench_table(rows):
    by = {}
    for r in rows:
        by.setdefault(r["workload"], {})[r["mode"]] = r
    out = [
        "| workload | kernels (unfused → fused) | moved MiB (unfused → fused) | peak MiB fused | unfused ms | fused ms | speedup |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    mib = 1 << 20
    for w, m in by.items():
        u, f = m.get("unfused"), m.get("fused")
        if not (u and f):
            continue
        sp = f.get("speedup")
        out.append(
            f"| {w} | {u['kernels']} → {f['kernels']} | {u['bytes_moved'] / mib:.1f} → {f['bytes_moved'] / mib:.1f} | "
            f"{f['peak_bytes'] / mib:.1f} | {fmt(u['median_ms'])} | {fmt(f['median_ms'])} | "
            f"{'—' if sp is None else f'{sp:.2f}×'} |"
        )
    return out


def peers_table(text):
    """Medians per (round, side, workload) from compare.sh's output."""
    med = {}
    rnd, side = None, None
    for line in text.splitlines():
        m = re.match(r"== round (\d+): (\w+)", line)
        if m:
            rnd, side = int(m.group(1)), m.group(2)
            continue
        m = re.match(r"(\S+)\s+median\s+([\d.]+) ms", line)
        if m and rnd is not None:
            med[(rnd, side, m.group(1))] = float(m.group(2))
    rounds = sorted({k[0] for k in med})
    workloads = list(dict.fromkeys(k[2] for k in med))
    head = "| workload | " + " | ".join(f"Burn r{r} | fusegraph r{r}" for r in rounds) + " | Burn / fusegraph |"
    out = [head, "| --- |" + " ---: | ---: |" * len(rounds) + " ---: |"]
    for w in workloads:
        cells, ratios = [], []
        for r in rounds:
            b, f = med.get((r, "Burn", w)), med.get((r, "fusegraph", w))
            cells += [fmt(b), fmt(f)]
            if b and f:
                ratios.append(b / f)
        ratio = f"{min(ratios):.1f}–{max(ratios):.1f}×" if ratios else "—"
        out.append(f"| {w} | " + " | ".join(cells) + f" | {ratio} |")
    return out


def device_section(folder):
    meta = load(os.path.join(folder, "meta.json"))
    info = load(os.path.join(folder, "info.json"))
    lines = [f"## {meta['title']}", ""]
    lines.append(
        f"{info['adapter']} ({info['backend']}, {info['device_type']}, driver {info['driver']} {info['driver_info']}); "
        f"machine: {meta['machine']}. Commit `{meta['commit']}`, {meta['date']}. Command: `{meta['command']}`."
    )
    lines.append("")
    notes = os.path.join(folder, "notes.md")
    if os.path.exists(notes):
        lines += open(notes).read().strip().splitlines() + [""]
    roof = []
    for p in sorted(glob.glob(os.path.join(folder, "roofline*.json"))):
        roof += load(p)
    if roof:
        lines += ["### Roofline (`fusegraph roofline`)", ""]
        lines += ["Medians; “% of copy”: against the f32 copy timed in turn with the row (reads + writes)."]
        lines += [""] + roofline_table(roof) + [""]
    bench = os.path.join(folder, "bench.json")
    if os.path.exists(bench):
        lines += ["### Fused against unfused (`fusegraph bench`)", ""] + bench_table(load(bench)) + [""]
    peers = os.path.join(folder, "peers.txt")
    if os.path.exists(peers):
        lines += ["### Burn beside fusegraph (`../shared/peers`, medians in ms, rounds in turn)", ""]
        lines += peers_table(open(peers).read()) + [""]
    return lines


def main():
    folders = [f for f in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*"))) if os.path.isdir(f)]
    # GPUs first.
    folders.sort(key=lambda f: load(os.path.join(f, "info.json"))["device_type"] == "Cpu")
    lines = [
        "# Benchmarks",
        "",
        "Current figures, one section per device, generated by `python3 scripts/benchmarks.py` from",
        "the programs' `--json` output under `benchmarks/<device>/` (see the script for the files).",
        "Only figures taken in one sitting are compared. lavapipe is a CPU emulation of a GPU:",
        "its rows are a smoke test, not performance.",
        "",
    ]
    for f in folders:
        lines += device_section(f)
    text = "\n".join(lines).rstrip() + "\n"
    if "--check" in sys.argv:
        sys.exit(0 if os.path.exists(OUT) and open(OUT).read() == text else 1)
    with open(OUT, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
