#!/usr/bin/env python3
"""Per-call cost of radiance.torch.RadianceLinear on the GPU host: CUDA
tensors in mapped mode (eager, and replayed from a CUDA graph) against CPU
tensors through the daemon's rings, on layers of the MiniLM checkpoint.

    python3 bench/torch_mapped.py SOCKET CHECKPOINT_DIR [--csv FILE]

For each layer and M: "eager" is the wall time of N back-to-back module calls
on CUDA tensors (torch's current stream, one synchronize at the end) divided
by N: what a Python engine pays per layer when the GPU keeps up (Python,
the custom op, the argument checks, the launches); "eager+sync" the same
with a synchronize after each call (latency); "graph" the replay of a CUDA
graph of N captured calls, divided by N (the launches alone, no Python);
"rings" a CPU tensor through the daemon per call (x is already on the host:
this is the rings without the engine's device copies). p50 of 7 repetitions
of N = 100 calls, in microseconds.
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402

import radiance  # noqa: E402
import radiance.torch as rt  # noqa: E402

LAYERS = ["encoder.layer.0.attention.self.query", "encoder.layer.0.intermediate.dense",
          "encoder.layer.0.output.dense"]
MS = [1, 16, 128]
N, REPS = 100, 7


def p50(f):
    ts = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t0) / N * 1e6)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("socket")
    ap.add_argument("checkpoint")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args()
    client = radiance.Client(a.socket, timeout=120)
    model = client.load(a.checkpoint)
    mm = rt.mapped(model)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {mm!r}")
    rows = []
    for name in LAYERS:
        mod = rt.RadianceLinear(model, name)
        for m in MS:
            x = torch.randn(m, mod.in_features, generator=torch.Generator().manual_seed(m))
            x = x.to(torch.bfloat16)
            xc = x.cuda()
            for _ in range(10):
                mod(xc)
            torch.cuda.synchronize()

            def eager():
                for _ in range(N):
                    mod(xc)
                torch.cuda.synchronize()

            def eager_sync():
                for _ in range(N):
                    mod(xc)
                    torch.cuda.synchronize()

            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                mod(xc)
            torch.cuda.current_stream().wait_stream(s)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                ys = [mod(xc) for _ in range(N)]

            def graph():
                g.replay()
                torch.cuda.synchronize()

            def rings():
                for _ in range(N):
                    mod(x)

            graph()
            same = torch.equal(ys[-1].cpu(), mod(x))
            r = {"layer": name, "shape": f"{mod.out_features}x{mod.in_features}", "m": m,
                 "eager_us": p50(eager), "eager_sync_us": p50(eager_sync), "graph_us": p50(graph),
                 "rings_us": p50(rings), "graph_equals_rings": same}
            rows.append(r)
            del g, ys
    print("| layer | N x K | M | eager | eager+sync | graph | rings (CPU tensor) | graph = rings bits |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['layer'].split('.', 3)[-1]} | {r['shape']} | {r['m']} | {r['eager_us']:.1f} | "
              f"{r['eager_sync_us']:.1f} | {r['graph_us']:.2f} | {r['rings_us']:.1f} | "
              f"{'yes' if r['graph_equals_rings'] else 'NO'} |")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("layer,shape,m,eager_us,eager_sync_us,graph_us,rings_us,graph_equals_rings\n")
            for r in rows:
                f.write(f"{r['layer']},{r['shape']},{r['m']},{r['eager_us']:.2f},"
                        f"{r['eager_sync_us']:.2f},{r['graph_us']:.3f},{r['rings_us']:.2f},"
                        f"{int(r['graph_equals_rings'])}\n")
    mm.close()
    model.close()
    client.close()
    return 0 if all(r["graph_equals_rings"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
