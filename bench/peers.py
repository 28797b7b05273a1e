#!/usr/bin/env python3
"""PyTorch peers for bench/bench_w4a8: measured in this separate process.

    python3 bench/peers.py OUT.csv [--quick]

Peers, on the bench's shapes and M values:
  torch_int4  torch.ops.aten._weight_int4pack_mm (tinygemm, bf16 activations,
              int4 weights, group size 128) -- PyTorch's int4 weight-only kernel
  torch_fp8   torch._scaled_mm with e4m3 activations and weights, row-wise
              scales, bf16 out (cuBLASLt fp8); M below 16 is padded to 16,
              which the kernel requires
Same method as the C bench: weights rotate over enough copies for >= 4x the
L2; time is the median of 7 batches of 20 calls between CUDA events.
Writes CSV lines "n,k,m,peer,us".
"""
import math
import sys

import torch

SHAPES = [(16384, 5120), (14336, 5120), (5120, 6144), (34816, 5120), (5120, 17408)]
MS = [1, 4, 8, 16, 32, 64, 256, 2048]
BATCH, REPS = 20, 7


def time_us(fn):
    for i in range(3):
        fn(i)
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times, it = [], 0
    for _ in range(REPS):
        start.record()
        for _ in range(BATCH):
            fn(it)
            it += 1
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / BATCH)
    times.sort()
    return times[REPS // 2]


def copies_for(nbytes, l2):
    return max(2, math.ceil(4 * l2 / nbytes))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "peers.csv"
    quick = "--quick" in sys.argv
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    l2 = getattr(props, "L2_cache_size", 60 * 1024 * 1024) or 60 * 1024 * 1024
    print(f"peers: torch {torch.__version__} on {props.name}, L2 {l2 / 1e6:.0f} MB", flush=True)
    lines = []
    torch.manual_seed(0)
    for n, k in SHAPES:
        ms = [m for m in MS if not quick or m in (1, 16, 2048)]
        x = (torch.randn(max(MS), k, device=dev) * 0.5).to(torch.bfloat16)
        # int4 weight-only (tinygemm)
        try:
            w_u8 = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
            packed = torch.ops.aten._convert_weight_to_int4pack(w_u8, 8)
            sz = torch.empty(k // 128, n, 2, dtype=torch.bfloat16, device=dev)
            sz[..., 0] = 0.01
            sz[..., 1] = 0.0
            c = copies_for(n * k // 2, l2)
            ws = [packed.clone() for _ in range(c)]
            del w_u8
            for m in ms:
                xm = x[:m].contiguous()
                us = time_us(lambda i: torch.ops.aten._weight_int4pack_mm(xm, ws[i % c], 128, sz))
                lines.append(f"{n},{k},{m},torch_int4,{us:.3f}")
                print(f"{n}x{k} M={m} torch_int4 {us:.2f} us", flush=True)
            del ws, packed
        except Exception as e:  # report and go on: a missing peer is a gap in the table, not a failure
            print(f"{n}x{k}: torch_int4 unavailable: {e}", flush=True)
        # fp8 scaled_mm
        try:
            wf = (torch.randn(n, k, device=dev) * 0.1).to(torch.float8_e4m3fn)
            c = copies_for(n * k, l2)
            ws = [wf.clone() for _ in range(c)]
            sb = torch.full((1, n), 0.01, dtype=torch.float32, device=dev)
            del wf
            for m in ms:
                mp = max(16, (m + 15) // 16 * 16)
                xf = x[:mp].to(torch.float8_e4m3fn).contiguous()
                sa = torch.full((mp, 1), 0.02, dtype=torch.float32, device=dev)
                try:
                    fn = lambda i: torch._scaled_mm(xf, ws[i % c].t(), scale_a=sa, scale_b=sb,
                                                    out_dtype=torch.bfloat16)
                    fn(0)
                except Exception:
                    one = torch.tensor(1.0, device=dev)
                    fn = lambda i: torch._scaled_mm(xf, ws[i % c].t(), scale_a=one, scale_b=one,
                                                    out_dtype=torch.bfloat16)
                us = time_us(fn)
                lines.append(f"{n},{k},{m},torch_fp8,{us:.3f}")
                print(f"{n}x{k} M={m} torch_fp8 {us:.2f} us", flush=True)
            del ws
        except Exception as e:
            print(f"{n}x{k}: torch_fp8 unavailable: {e}", flush=True)
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        f.write("n,k,m,peer,us\n")
        f.write("\n".join(lines) + "\n")
    print(f"peers: wrote {len(lines)} results to {out}", flush=True)


if __name__ == "__main__":
    main()
