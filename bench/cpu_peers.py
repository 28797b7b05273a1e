#!/usr/bin/env python3
"""numpy/OpenBLAS peer for bench/bench_cpu.c, and the results files.

    python3 bench/cpu_peers.py BENCH.csv [BENCH.csv ...] --out bench/results/cpu-DATE
            [--load "uptime line"] [--machine "what ran it"] [--no-peer]

BENCH.csv are bench_cpu's rows (threads 1 and 2 runs). For each (threads,
shape, m) they hold, this times numpy's fp32 matmul x[m, k] @ W.T on
dequantized weights W[n, k] = (c - 8) * scale (random int4 codes, generated
here; the same shapes and m, not the same numbers) with OpenBLAS limited to
that thread count through threadpoolctl, which also names the kernel
OpenBLAS picked. Run it without OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE in the
environment (env -u ...), so OpenBLAS picks its kernel itself.
Writes OUT.csv (bench columns) and OUT.md (targets met or missed).
PyTorch (F.linear in fp32 and bf16, torch.set_num_threads to the same
thread count) and ggml's int4 matmul (ggml-python, Q4_0 weights, up to M=64)
are peers where they are installed (bench/requirements-engine.txt installs
torch; pip install ggml-python; OUT.md says which ran).
"""
import argparse
import csv
import importlib.util
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

COLS = ["date", "cpu", "threads", "shape", "m", "us", "gbps", "probe_us", "fraction_of_probe",
        "peer", "peer_us", "simd", "cpu_us", "fma_us", "fraction_of_fma", "peak_us",
        "fraction_of_peak"]
SHAPES_27B = ["16384x5120", "14336x5120", "5120x6144", "34816x5120", "5120x17408"]


def time_us(fn, budget=0.5, least=3, most=200):
    fn()
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    reps = max(least, min(most, int(budget / max(first, 1e-7))))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def cases(rows, max_m=None):
    """{shape: {(threads, m), ...}} of the bench rows (m <= max_m if given)."""
    want = {}
    for r in rows:
        if max_m is None or int(r["m"]) <= max_m:
            want.setdefault(r["shape"], set()).add((int(r["threads"]), int(r["m"])))
    return want


def dequant_weights(n, k):
    """W [n, k] float32 = (c - 8) * 0.01 for random int4 codes c, the same
    codes for a shape in every peer (seeded by the shape)."""
    w = np.random.default_rng([n, k]).integers(0, 16, size=(n, k), dtype=np.int8)
    w = w.astype(np.float32)
    w -= 8.0
    w *= 0.01
    return w


def numpy_peers(rows):
    rng = np.random.default_rng(1)
    out, arch = {}, "?"
    for shape, tm in cases(rows).items():
        n, k = map(int, shape.split("x"))
        w = dequant_weights(n, k)
        maxm = max(m for _, m in tm)
        x = rng.standard_normal((maxm, k), dtype=np.float32)
        for threads, m in sorted(tm):
            with threadpool_limits(limits=threads, user_api="blas"):
                info = [i for i in threadpool_info() if i["user_api"] == "blas"]
                arch = f"{info[0]['internal_api']} {info[0].get('version', '')} " \
                       f"{info[0].get('architecture', '?')}" if info else "?"
                xm = x[:m]
                out[(threads, shape, m)] = time_us(lambda: xm @ w.T,
                                                   least=3 if m >= 64 else 5)
        del w
    return out, arch


def torch_peers(rows):
    """(threads, shape, m) -> {"fp32": us, "bf16": us}: torch's CPU linear
    (F.linear, x[m, k] @ W.T) on the same shapes and thread counts, W
    dequant_weights() (as numpy_peers), in fp32 and (M <= 16) bf16; and
    torch's name for its BLAS. Empty where torch is not installed."""
    if importlib.util.find_spec("torch") is None:
        return {}, "not installed"
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    out = {}
    with torch.inference_mode():
        for shape, tm in cases(rows).items():
            n, k = map(int, shape.split("x"))
            w = torch.from_numpy(dequant_weights(n, k))
            wb = w.bfloat16()
            x = torch.randn(max(m for _, m in tm), k, generator=g)
            xb = x.bfloat16()
            for threads, m in sorted(tm):
                torch.set_num_threads(threads)
                xm, xbm = x[:m], xb[:m]
                least = 3 if m >= 64 else 5
                out[(threads, shape, m)] = {"fp32": time_us(lambda: F.linear(xm, w), least=least)}
                if m <= 16:   # without AVX512-BF16 torch's bf16 runs ~20x slower than fp32
                    out[(threads, shape, m)]["bf16"] = time_us(lambda: F.linear(xbm, wb), least=3)
            del w, wb
    blas = "mkl" if torch.backends.mkl.is_available() else "?"
    return out, f"torch {torch.__version__} {blas} {torch.backends.cpu.get_cpu_capability()}"


def ggml_peers(rows):
    """(threads, shape, m) -> us of ggml's int4 matmul (ggml-python's
    bindings, PyPI): dequant_weights() quantized to Q4_0 (blocks of 32, one
    fp16 scale), x fp32, which ggml quantizes to Q8_0
    for its integer dot products: the peer closest to W4A8 in kind. Up to
    M=64 (beyond that a 27B shape takes seconds a call). Empty where
    ggml-python does not import."""
    if importlib.util.find_spec("ggml") is None:
        return {}, "not installed"
    import ctypes

    import ggml
    import ggml.utils

    rng = np.random.default_rng(1)
    out = {}
    for shape, tm in cases(rows, max_m=64).items():
        n, k = map(int, shape.split("x"))
        wf = dequant_weights(n, k)
        for threads, m in sorted(tm):
            need = n * k // 2 + n * k // 32 * 2 + (k + n) * m * 4 + (64 << 20)
            ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=need, mem_buffer=None,
                                                       no_alloc=False))
            try:
                w = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_Q4_0, k, n)
                x = ggml.ggml_new_tensor_2d(ctx, ggml.GGML_TYPE_F32, k, m)
                ggml.ggml_quantize_chunk(ggml.GGML_TYPE_Q4_0,
                                         wf.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                         ggml.ggml_get_data(w), 0, n, k, None)
                ggml.utils.to_numpy(x)[:] = rng.standard_normal((m, k), dtype=np.float32)
                gf = ggml.ggml_new_graph(ctx)
                ggml.ggml_build_forward_expand(gf, ggml.ggml_mul_mat(ctx, w, x))
                out[(threads, shape, m)] = time_us(
                    lambda: ggml.ggml_graph_compute_with_ctx(ctx, gf, threads),
                    least=3 if m >= 16 else 5)
            finally:
                ggml.ggml_free(ctx)
        del wf
    from importlib.metadata import version

    return out, f"ggml-python {version('ggml_python')} Q4_0 x Q8_0"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--load", default="")
    ap.add_argument("--machine", default="",
                    help="the machine in words (cores, VM, whether it was shared); "
                         "default: the CPU name and kernels of the rows")
    ap.add_argument("--no-peer", action="store_true")
    a = ap.parse_args()
    rows = []
    for path in a.bench:
        with open(path) as f:
            rows += [r for r in csv.DictReader(f)]
    peers, arch = ({}, "not run") if a.no_peer else numpy_peers(rows)
    peer_name = f"numpy-fp32 ({arch})"
    tpeers, tname = ({}, "not run") if a.no_peer else torch_peers(rows)
    gpeers, gname = ({}, "not run") if a.no_peer else ggml_peers(rows)
    torch_here = bool(tpeers)

    with open(a.out + ".csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=COLS, lineterminator="\n")
        wr.writeheader()
        for r in rows:
            key = (int(r["threads"]), r["shape"], int(r["m"]))
            if r["peer"]:
                wr.writerow(r)
            if key in peers:
                wr.writerow({**r, "peer": peer_name, "peer_us": f"{peers[key]:.1f}"})
            for dt, us in tpeers.get(key, {}).items():
                wr.writerow({**r, "peer": f"torch-{dt} ({tname})", "peer_us": f"{us:.1f}"})
            if key in gpeers:
                wr.writerow({**r, "peer": f"ggml-int4 ({gname})", "peer_us": f"{gpeers[key]:.1f}"})
            if key not in peers and not r["peer"] and key not in tpeers and key not in gpeers:
                wr.writerow(r)

    by = {(int(r["threads"]), r["shape"], int(r["m"])): r for r in rows}
    ref = {k: float(r["peer_us"]) for k, r in by.items() if r["peer"].startswith("scalar")}
    md = []
    cpu = rows[0]["cpu"] if rows else "?"
    md.append(f"# CPU backend fast path, {rows[0]['date'] if rows else ''}\n")
    simd = ", ".join(sorted({r.get("simd", "") for r in rows if r.get("simd")})) or "?"
    threads = ", ".join(str(t) for t in sorted({int(r["threads"]) for r in rows}))
    md.append(f"Machine: {a.machine or cpu}; kernels {simd}, threads {threads} "
              "(bench/bench_cpu.c through kernels/cpu_fast.h, as the daemon runs them). "
              f"Load at start: `{a.load}`. Times are medians, and the read probe is measured in "
              "the same conditions right before each shape, but both move from run to run.\n")
    md.append("27B shapes read their weights from DRAM (the bench rotates copies over a working "
              "set of 4x the last-level cache, at least 128 MiB); MiniLM shapes stay in cache, as when that model is "
              "served. `fraction` = probe_us / us (1.0: as fast as reading the bytes). "
              + ("Peers were not run (--no-peer).\n" if a.no_peer else
                 f"numpy peer: {peer_name}, fp32 matmul on dequantized fp32 weights (8x the bytes "
                 "of int4). " + (f"torch peers: {tname}, F.linear in fp32 and bf16 on the same "
                                 "random weights, torch.set_num_threads(threads)." if torch_here
                                 else "PyTorch is not installed here: no torch peer.") +
                 (f" ggml peer: {gname}, M <= 64." if gpeers else " ggml-python: not installed.")
                 + "\n"))
    md.append("## Targets\n")
    md.append("| threads | shape | M=1 us | probe us | fraction (>= 0.7) | M=16 us | M16/M1 (<= 3) "
              "| scalar ref M=1 us | speed-up |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    for (t, shape, m), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] not in SHAPES_27B,
                                                               kv[0][1])):
        if m != 1:
            continue
        frac = float(r["fraction_of_probe"])
        r16 = by.get((t, shape, 16))
        ratio = float(r16["us"]) / float(r["us"]) if r16 else None
        is27 = shape in SHAPES_27B
        fr = f"{frac:.2f} " + (("met" if frac >= 0.7 else f"missed by {0.7 - frac:.2f}")
                               if is27 else "(no target)")
        rr = "" if ratio is None else f"{ratio:.1f} " + (("met" if ratio <= 3 else
                                                          f"missed ({ratio / 3:.1f}x over)")
                                                         if is27 else "(no target)")
        rf = ref.get((t, shape, 1))
        us = float(r["us"])
        rf_s = "" if rf is None else f"{rf:.1f}"
        up_s = "" if rf is None else f"{rf / us:.1f}x"
        md.append(f"| {t} | {shape} | {us:.1f} | {float(r['probe_us']):.1f} | {fr} | "
                  f"{r16['us'] if r16 else ''} | {rr} | {rf_s} | {up_s} |")
    md.append("\n## All rows\n")
    md.append("| threads | shape | m | us | GB/s (int4+scales) | probe us | fraction | numpy us "
              "| torch fp32 us | torch bf16 us | ggml int4 us |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for (t, shape, m), r in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] not in SHAPES_27B,
                                                               kv[0][1], kv[0][2])):
        p = peers.get((t, shape, m))
        tp = tpeers.get((t, shape, m), {})
        cells = ["" if v is None else "%.1f" % v
                 for v in (p, tp.get("fp32"), tp.get("bf16"), gpeers.get((t, shape, m)))]
        md.append(f"| {t} | {shape} | {m} | {float(r['us']):.1f} | {r['gbps']} | {r['probe_us']} | "
                  f"{r['fraction_of_probe']} | " + " | ".join(cells) + " |")
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
