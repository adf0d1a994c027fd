#!/usr/bin/env python3
"""The speed table of issue 8, regenerated: BlueVM beside llama.cpp on the same synthetic models.

Makes each model with our own `blue-synth` (stories260K is the real one from ../shared), runs
`bluevm bench --json` on it, and prints markdown: prompt and generation speed, what they are as
a fraction of the device's measured ceilings (FP32 FMA for prompts, read bandwidth for
generation), and llama.cpp's figures for the same shapes from ../shared/PEERS.md (its native CPU
backend and its Vulkan backend on lavapipe) with our ratio to each. Then the batched table:
aggregate generation at 1 / 4 / 16 / 64 instances (after the prompts, as llama-batched-bench's
S_TG, and with them) against llama.cpp's batched CPU figures.

  python3 tools/bench_table.py [--build build] [--shared ../shared] [--models /tmp/blue-bench]
                               [--rows stories260K,peer-dim256,...] [--no-batched] [--reps 2]

Each row takes from seconds (stories260K) to a few minutes (tinyllama-1.1b, which makes a 640 MB
file first); the synthetic files are kept in --models and reused. Read the figures with the
machine's load (printed at the start and the end): the host's bandwidth swings by about 30 %.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

# Our row -> (how the model is made, PEERS.md row label, tg tokens, batched?)
ROWS = {
    "stories260K": (None, "stories260K F32 (real)", 32, False),
    "peer-dim256": ("peer-dim256", "dim 256, 4 layers, vocab 32k", 32, True),
    "stories110M": ("stories110M", "stories110M shape, Q4_0", 32, True),
    "peer-dim1024": ("peer-dim1024", "dim 1024, 12 layers", 16, True),
    "tinyllama-1.1b": ("tinyllama-1.1b", "TinyLlama-1.1B shape, Q4_0", 16, False),
    "peer-moe": ("peer-moe", "MoE dim 256, 8 experts top-2", 32, False),
}
BATCHED_LABEL = {"peer-dim256": "dim 256 Q4_0", "stories110M": "stories110M Q4_0", "peer-dim1024": "dim 1024 Q4_0"}
INSTANCES = [1, 4, 16, 64]


def fail(msg):
    sys.exit(f"bench_table: {msg}")


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        fail(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout


def number(text):
    """A PEERS.md cell: '1540' or '17.3' or '—' (none); raises ValueError for a header."""
    text = text.strip()
    return None if text in ("—", "-", "") else float(text)


def peer_tables(path):
    """{label: (cpu_pp, cpu_tg, vk_pp, vk_tg)} and {label: [B=1, 4, 16, 64]} from PEERS.md."""
    single, batched = {}, {}
    for line in open(path, encoding="utf-8"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and "/" in cells[1]:
            try:
                cpu = [number(x) for x in cells[1].split("/")]
                vk = [number(x) for x in cells[2].split("/")] if "/" in cells[2] else [None, None]
            except ValueError:
                continue  # the header row
            single[cells[0]] = (cpu[0], cpu[1], vk[0], vk[1])
        elif len(cells) == 5 and all(re.fullmatch(r"[0-9.]+", c) for c in cells[1:]):
            batched[cells[0]] = [float(c) for c in cells[1:]]
    return single, batched


def find_peer(table, label):
    for key, value in table.items():
        if key.startswith(label):
            return value
    return None


def model_file(args, row):
    preset = ROWS[row][0]
    if preset is None:
        path = os.path.join(args.shared, "models", "stories260K", "stories260K.gguf")
        if not os.path.exists(path):
            fail(f"{path} is missing (the real stories260K model from ../shared)")
        return path
    os.makedirs(args.models, exist_ok=True)
    path = os.path.join(args.models, f"{preset}-q4_0.gguf")
    if not os.path.exists(path):
        print(f"<!-- making {path} -->", file=sys.stderr)
        run([args.synth, "-p", preset, "-t", "q4_0", "-o", path])
    return path


def bench(args, path, extra):
    out = run([args.bluevm, "bench", "-m", path, "--json"] + extra)
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        fail(f"bench printed no JSON for {path}:\n{out[-2000:]}")


def fmt(x, digits=None):
    if x is None:
        return "—"
    if digits is None:
        digits = 0 if x >= 100 else 1 if x >= 10 else 2
    return f"{x:,.{digits}f}"


def ratio(a, b):
    return "—" if a is None or b in (None, 0) else f"{a / b:.2f}×"


# Kernel choices taken from the environment (bluevm reads them); the table's command names them.
ENV_CHOICES = ("BLUE_MATMUL_INT8", "BLUE_DECODE_KERNEL", "BLUE_GEMM_MIN_ITEMS", "BLUE_ATTN_KERNEL")


def machine():
    model = "unknown CPU"
    for line in open("/proc/cpuinfo", encoding="utf-8"):
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{os.cpu_count()} vCPUs of {model}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--shared", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared"))
    ap.add_argument("--models", default="/tmp/blue-bench-models")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--no-batched", action="store_true")
    args = ap.parse_args()
    args.bluevm = os.path.join(args.build, "host", "bluevm")
    args.synth = os.path.join(args.build, "tools", "synth", "blue-synth")
    for tool in (args.bluevm, args.synth):
        if not os.access(tool, os.X_OK):
            fail(f"{tool} not found: build first (bash tools/build.sh) or pass --build")
    rows = [r for r in args.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            fail(f"unknown row '{r}'; rows: {', '.join(ROWS)}")
    peers_path = os.path.join(args.shared, "PEERS.md")
    if not os.path.exists(peers_path):
        fail(f"{peers_path} is missing")
    peer_single, peer_batched = peer_tables(peers_path)

    load0 = os.getloadavg()[0]
    results, ceilings, device = {}, None, None
    for r in rows:
        path = model_file(args, r)
        extra = ["-p", "64", "-n", str(ROWS[r][2]), "--reps", str(args.reps)]
        if ceilings is not None:
            extra.append("--no-ceilings")
        j = bench(args, path, extra)
        if ceilings is None:
            ceilings, device = j["ceilings"], j["device"]
        results[r] = j
    batched = {}
    if not args.no_batched:
        for r in rows:
            if not ROWS[r][3]:
                continue
            j = bench(args, model_file(args, r), ["-p", "32", "-n", "32", "--reps", "1", "--no-ceilings",
                                                  "--instances", ",".join(map(str, INSTANCES))])
            batched[r] = ([b["tok_per_s"] for b in j["batched"]],
                          [b["with_prompt_tok_per_s"] for b in j["batched"]])
    load1 = os.getloadavg()[0]

    fma, read = ceilings["device_fma_gflops"], ceilings["device_read_gb_per_s"]
    print(f"Measured {datetime.date.today().isoformat()} on {machine()}, {device}; load average "
          f"{load0:.1f} at the start, {load1:.1f} at the end. Device ceilings (`bluevm bench`): FP32 FMA "
          f"{fma:.0f} GFLOP/s ({ceilings['device_fma_shape']}), read {read:.1f} GB/s "
          f"({ceilings['device_read_shape']}); native on the same cores: FMA "
          f"{ceilings['native_fma_gflops']:.0f} GFLOP/s ({ceilings['native_isa']}), read "
          f"{ceilings['native_read_gb_per_s']:.1f} GB/s. llama.cpp's figures are ../shared/PEERS.md's. "
          f"Command: `{''.join(f'{v}={os.environ[v]} ' for v in ENV_CHOICES if v in os.environ)}"
          f"python3 tools/bench_table.py` (pp64, tg{'/'.join(sorted({str(ROWS[r][2]) for r in rows}))}, "
          f"best of {args.reps}).\n")
    print("| model | BlueVM pp / tg tok/s | pp GFLOP/s (of FMA ceiling) | tg weights GB/s (of read ceiling) "
          "| llama.cpp CPU pp / tg | BlueVM / CPU pp, tg | llama.cpp Vulkan on lavapipe pp / tg | BlueVM / Vulkan pp, tg |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        j = results[r]
        pp, tg = j["pp"]["tok_per_s"], j["tg"]["tok_per_s"]
        pp_gf = j["flops_per_token"] * pp / 1e9
        tg_gb = j["weight_bytes_per_token"] * tg / 1e9
        cpu_pp, cpu_tg, vk_pp, vk_tg = find_peer(peer_single, ROWS[r][1]) or (None,) * 4
        name = r if ROWS[r][0] is None else f"{r} Q4_0"
        print(f"| {name} | {fmt(pp)} / {fmt(tg)} | {fmt(pp_gf)} ({100 * pp_gf / fma:.1f} %) | "
              f"{fmt(tg_gb)} ({100 * tg_gb / read:.1f} %) | {fmt(cpu_pp)} / {fmt(cpu_tg)} | "
              f"{ratio(pp, cpu_pp)}, {ratio(tg, cpu_tg)} | {fmt(vk_pp)} / {fmt(vk_tg)} | "
              f"{ratio(pp, vk_pp)}, {ratio(tg, vk_tg)} |")
    if batched:
        print("\nBatched: 32 prompt + 32 generated tokens per sequence, aggregate generation tok/s at "
              "1 / 4 / 16 / 64 instances after the prompts, as `llama-batched-bench`'s S_TG (llama.cpp: "
              "its sequences, CPU backend); then ours with the prompts' time counted.\n")
        print("| model | BlueVM 1 / 4 / 16 / 64 | 64 / 1 | llama.cpp CPU 1 / 4 / 16 / 64 | BlueVM / CPU at 64 "
              "| BlueVM with prompts 1 / 4 / 16 / 64 | 64 / 1 |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r, (tps, with_prompt) in batched.items():
            peer = find_peer(peer_batched, BATCHED_LABEL[r])
            print(f"| {r} Q4_0 | {' / '.join(fmt(t) for t in tps)} | {ratio(tps[-1], tps[0])} | "
                  f"{' / '.join(fmt(t) for t in peer) if peer else '—'} | "
                  f"{ratio(tps[-1], peer[-1] if peer else None)} | "
                  f"{' / '.join(fmt(t) for t in with_prompt)} | {ratio(with_prompt[-1], with_prompt[0])} |")


if __name__ == "__main__":
    main()
