#!/usr/bin/env python3
"""Run the all-MiniLM-L6-v2 engine (minilm.py) in N worker processes against
a running radianced, and compare with the fp32 model.

    RADIANCE_LIBRARY=build/libradiance.so.0 python3 examples/engine/run.py \\
        --socket /tmp/r.sock --workers 2

This process loads the checkpoint once (its session holds the model); each
worker connects its own Client, attaches the model by name, and encodes
every sentence of the reference file (tests/data/minilm-sentences.json). All
workers start encoding at the same moment. Printed per worker: cosine of
each embedding with the fp32 model's (min, with the sentence, and mean), the
Spearman correlation of the similarities of all sentence pairs with the fp32
model's, sentences per second, and the PSS (proportional set size, from
/proc/PID/smaps_rollup) of the worker and of the daemon, read while every
worker is still alive: the model's weights are resident once, in the daemon.

Every weight a worker uses comes from the daemon: the linears run there,
and the embeddings and LayerNorm weights and biases are read-only views of
the model's shared tensors (one sealed memfd, the same pages in every
worker). The PSS columns split each process's memory: "anon" is its own
(numpy temporaries, Python, libraries), "shmem" its share of the shared
tensors' pages it touched (shared by every worker that maps them; the daemon
keeps them without mapping them, charged to the model's resident bytes).

--device cuda runs the torch engine instead (minilm_torch.py): tensors on
the GPU, every linear mapped from the daemon (which must run the gpu
backend) and run in the worker on the daemon's weights, the rest in torch;
each worker also reports its device memory (torch's peak, the mapping's
scratch; the weights are mapped, not copied).

Exit status: 0, 1 when a worker failed, a result is below the bounds
(--min-cos, --min-mean-cos, --min-spearman, --min-spearman-pairs;
docs/accuracy.md explains the defaults) or PyPI's tokenizers is not
installed (said at once, before anything else), 2 for a usage error.
"""
import argparse
import hashlib
import json
import multiprocessing as mp
import os
import socket as socketlib
import struct
import sys
import time

# Each worker is one thread of numpy (the daemon's pool runs the linears): a
# BLAS with a thread per core in every worker fights the daemon and the other
# workers for the cores, and its threads' wake-ups cost more than the small
# attention matmuls they split (measured here: 4.1 s of a 15.7 s pass in
# q @ k with OpenBLAS's 2 threads, 0.1 s with one). Set before numpy is
# imported; the spawned workers inherit it. Set the variables to override.
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")
# glibc's malloc gives a freed heap top back to the kernel once it passes a
# few MB, so each batch's arrays (a linear's output is up to 3 MB) were
# faulted in afresh, page by page: ~20 ms of a ~650 ms pass here (the
# float32 widening of the daemon's bf16 outputs went from 42 to 24 ms of CPU
# time a pass with these). Keep freed memory for the next batch instead (the
# worker's heap stays at its peak, tens of MB). Read by glibc at the
# workers' start; set the variables to override.
for _v, _n in (("MALLOC_TRIM_THRESHOLD_", 256 << 20), ("MALLOC_MMAP_THRESHOLD_", 32 << 20)):
    os.environ.setdefault(_v, str(_n))

try:   # the engine's tokenizer: fail here, clearly, not in every worker
    import tokenizers  # noqa: F401
except ImportError as e:
    sys.exit(f"run.py: the engine needs PyPI's tokenizers package ({e}): "
             f"pip install tokenizers, or pip install -r tests/requirements.txt "
             f"(make demo installs it into build/pyenv)")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
try:
    import radiance
except ImportError:   # run from a checkout without `pip install ./python`
    sys.path.insert(0, os.path.join(REPO, "python"))
    import radiance

import numpy as np  # noqa: E402

import minilm  # noqa: E402

# Bounds on the results (docs/accuracy.md, "Sentence embeddings"): below the
# values measured on the CPU backend with margin, above what a broken
# pipeline gives.
MIN_COS = 0.65
MIN_MEAN_COS = 0.92
MIN_SPEARMAN = 0.88          # all pairs of sentences
MIN_SPEARMAN_PAIRS = 0.95    # the designed pairs: paraphrases and unrelated


def pss_kib(pid):
    """{"Pss": kB, "Pss_Anon": ..., ...} of /proc/pid/smaps_rollup."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k.startswith("Pss") or k == "Rss":
                out[k] = int(v.split()[0])
    return out


def daemon_pid(path):
    """The pid of the process listening on the socket (SO_PEERCRED of a
    connection that says nothing and closes: the daemon drops it)."""
    with socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM) as s:
        s.connect(path)
        cred = s.getsockopt(socketlib.SOL_SOCKET, socketlib.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", cred)[0]


def mapped_weights():
    """Whether this process maps the checkpoint's weights file, and the
    daemon's shared tensors (/proc/self/maps)."""
    with open("/proc/self/maps") as f:
        maps = f.read()
    return {"maps_checkpoint": ".safetensors" in maps, "maps_shared_tensors": "radiance-tensors" in maps}


def worker(idx, conn, args):
    try:
        sentences, _, ref, meta = minilm.load_reference(args.reference)
        pairs = minilm.reference_pairs(meta)
        if args.sentences and args.sentences < len(sentences):
            # every k-th sentence: a quick run that still spans the groups
            keep = list(range(0, len(sentences), -(-len(sentences) // args.sentences)))
            new = {old: i for i, old in enumerate(keep)}
            sentences, ref = [sentences[i] for i in keep], ref[keep]
            pairs = np.array([[new[a], new[b]] for a, b in pairs if a in new and b in new],
                             np.int64).reshape(-1, 2)
        client = radiance.Client(args.socket, name=f"engine-worker-{idx}")
        model = client.attach(args.model_name)
        if args.device == "cuda":
            import minilm_torch

            enc = minilm_torch.TorchMiniLM.from_checkpoint(model, args.checkpoint, device="cuda")
            enc.encode(sentences[:2])   # warm-up: CUDA kernels, the mapping's first launches
        else:
            enc = minilm.MiniLM.from_checkpoint(model, args.checkpoint)
        conn.send(("ready", None))
        conn.recv()   # "go": every worker starts at once
        t0 = time.monotonic()
        for _ in range(args.passes):
            emb = enc.encode(sentences, batch_tokens=args.batch_tokens)
        dt = time.monotonic() - t0
        r = minilm.compare(emb, ref, pairs if len(pairs) > 2 else None)
        conn.send(("result", {
            "worker": idx, "pid": os.getpid(), "session": client.session_id,
            "sentences": len(sentences), "passes": args.passes, "seconds": dt,
            "sentences_per_s": len(sentences) * args.passes / dt,
            "cos_min": r["cos_min"], "cos_min_sentence": sentences[r["cos_argmin"]],
            "cos_mean": r["cos_mean"], "spearman": r["spearman"],
            "spearman_pairs": r.get("spearman_pairs", float("nan")), "n_pairs": len(pairs),
            "cos": [float(c) for c in r["cos"]],
            "embeddings_sha256": hashlib.sha256(emb.astype("<f4").tobytes()).hexdigest(),
            "pss_kib": pss_kib(os.getpid()),
            "gpu": minilm_torch.device_memory(enc.mapped) if args.device == "cuda" else None,
            **mapped_weights(),
        }))
        conn.recv()   # "exit": stay alive (and attached) until the daemon's PSS is read
        client.close()
    except BaseException as e:   # reported to the parent, which fails the run
        conn.send(("error", f"{type(e).__name__}: {e}"))


def mib(kib):
    return kib / 1024.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--socket", default=None, help="the daemon's socket (default: libradiance's)")
    ap.add_argument("--data", default=os.path.join(REPO, "tests", "data"),
                    help="test data directory (default tests/data)")
    ap.add_argument("--batch-tokens", type=int, default=512,
                    help="padded tokens per batch (default 512, the daemon's default max_rows)")
    ap.add_argument("--passes", type=int, default=1, help="passes over the sentences (default 1)")
    ap.add_argument("--sentences", type=int, default=0,
                    help="at most N sentences, every k-th of the file (a quick run; default all)")
    ap.add_argument("--daemon-pid", type=int, default=0,
                    help="the daemon's pid, for its PSS (default: from the socket, SO_PEERCRED)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: the numpy engine, linears through the rings (default); cuda: the "
                         "torch engine on the GPU, linears mapped (minilm_torch.py)")
    ap.add_argument("--json", default=None, help="also write the results to this file")
    ap.add_argument("--min-cos", type=float, default=MIN_COS)
    ap.add_argument("--min-mean-cos", type=float, default=MIN_MEAN_COS)
    ap.add_argument("--min-spearman", type=float, default=MIN_SPEARMAN)
    ap.add_argument("--min-spearman-pairs", type=float, default=MIN_SPEARMAN_PAIRS)
    args = ap.parse_args(argv)
    if args.workers < 1 or args.passes < 1 or args.batch_tokens < 1 or args.sentences < 0:
        ap.error("--workers, --passes and --batch-tokens must be at least 1")
    args.checkpoint = os.path.join(args.data, "minilm-w4g128")
    args.reference = os.path.join(args.data, "minilm-sentences.json")
    for p in (args.checkpoint, args.reference):
        if not os.path.exists(p):
            ap.error(f"{p} is missing")

    try:
        client = radiance.Client(args.socket, name="engine-runner")
        model = client.load(args.checkpoint)    # held until the end: resident once
    except radiance.RadianceError as e:
        print(f"run.py: {e}", file=sys.stderr)
        return 1
    args.socket = client.socket
    args.model_name = model.name
    info = client.server_info
    try:
        dpid = args.daemon_pid or daemon_pid(args.socket)
    except OSError as e:
        print(f"run.py: cannot find the daemon's pid through {args.socket}: {e} "
              f"(--daemon-pid)", file=sys.stderr)
        return 1

    ctx = mp.get_context("spawn")   # workers connect their own sessions
    pipes, procs = [], []
    for i in range(args.workers):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=worker, args=(i, child, args))
        p.start()
        pipes.append(parent)
        procs.append(p)
    failures = []
    results = []
    try:
        for i, c in enumerate(pipes):
            kind, what = c.recv()
            if kind != "ready":
                failures.append(f"worker {i}: {what}")
        if not failures:
            for c in pipes:
                c.send("go")
            for i, c in enumerate(pipes):
                kind, what = c.recv()
                if kind == "result":
                    results.append(what)
                else:
                    failures.append(f"worker {i}: {what}")
        daemon_pss = pss_kib(dpid)
        resident = {m.name: m for m in client.resident_models()}[model.name]
        tensors_bytes = model.shared_bytes
        shared_tensors = model.tensors
    finally:
        for c in pipes:
            try:
                c.send("exit")
            except OSError:
                pass
        for p in procs:
            p.join(60)
        client.close()

    n = results[0]["sentences"] if results else 0
    print(f"all-MiniLM-L6-v2 engine (examples/engine) on radianced {info['server_version']}, "
          f"backend {info['backend']} ({info['device']})")
    print(f"{args.workers} worker processes, {n} sentences x {args.passes} pass(es) each, batches of "
          f"<= {args.batch_tokens} padded tokens; " +
          ("every linear from the daemon, the rest in numpy" if args.device == "cpu" else
           "tensors on the GPU, every linear mapped from the daemon, the rest in torch"))
    print("against the fp32 model (sentence-transformers; tests/data/minilm-sentences.json):")
    print("cosine of each embedding with the fp32 one; Spearman of the pair similarities, over")
    npairs = results[0]["n_pairs"] if results else 0
    print(f"all {n * (n - 1) // 2} sentence pairs and over the {npairs} designed ones "
          f"(paraphrase and unrelated pairs)")
    print()
    print(f"{'worker':>6} {'pid':>7} {'session':>7}  {'cos min':>7}  {'(sentence)':<14} {'cos mean':>8} "
          f"{'sp. all':>7} {'sp. pairs':>9} {'sent/s':>7} {'PSS MiB':>8} {'anon':>6} {'shmem':>6}")
    for r in results:
        s = r["cos_min_sentence"]
        s = (s if len(s) <= 12 else s[:9] + "...")
        print(f"{r['worker']:>6} {r['pid']:>7} {r['session']:>7}  {r['cos_min']:7.4f}  "
              f"{json.dumps(s, ensure_ascii=False):<14} {r['cos_mean']:8.4f} {r['spearman']:7.4f} "
              f"{r['spearman_pairs']:9.4f} {r['sentences_per_s']:7.1f} "
              f"{mib(r['pss_kib']['Pss']):8.1f} {mib(r['pss_kib'].get('Pss_Anon', 0)):6.1f} "
              f"{mib(r['pss_kib'].get('Pss_Shmem', 0)):6.1f}")
    print(f"{'daemon':>6} {dpid:>7} {'':>7}  {'':7}  {'':<14} {'':8} {'':7} {'':9} {'':7} "
          f"{mib(daemon_pss['Pss']):8.1f} {mib(daemon_pss.get('Pss_Anon', 0)):6.1f} "
          f"{mib(daemon_pss.get('Pss_Shmem', 0)):6.1f}")
    print()
    shared = sum(t.bytes for t in shared_tensors)
    print(f"model '{model.name}' resident once in the daemon: {resident.resident_bytes / 2**20:.1f} MiB "
          f"(linear weights {(resident.resident_bytes - tensors_bytes) / 2**20:.1f} MiB, shared "
          f"tensors {tensors_bytes / 2**20:.1f} MiB: {len(shared_tensors)} tensors, "
          f"{shared / 2**20:.1f} MiB of data), {resident.users} sessions using it (the runner and "
          f"{len(results)} workers); the workers hold no weights of their own")
    for r in results:
        g = r.get("gpu")
        if g:
            print(f"worker {r['worker']} on the GPU: mapped {g['mapped_bytes'] / 2**20:.1f} MiB "
                  f"({g['handle']}{', read-only' if g['read_only'] else ''}; the daemon's copy), "
                  f"scratch {g['scratch_bytes'] / 2**20:.1f} MiB, torch peak "
                  f"{g['torch_max_allocated'] / 2**20:.1f} MiB; device in use "
                  f"{g['device_used'] / 2**20:.0f} MiB of {g['device_total'] / 2**20:.0f}")
    same = len({r["embeddings_sha256"] for r in results}) == 1
    if len(results) > 1:
        print(f"workers' embeddings bit-identical: {'yes' if same else 'NO'}")

    for r in results:
        for what, got, bound in (("cos min", r["cos_min"], args.min_cos),
                                 ("cos mean", r["cos_mean"], args.min_mean_cos),
                                 ("spearman (all pairs)", r["spearman"], args.min_spearman),
                                 ("spearman (designed pairs)", r["spearman_pairs"],
                                  args.min_spearman_pairs if r["n_pairs"] > 2 else float("nan"))):
            if bound != bound:   # too few designed pairs in a --sentences subset
                continue
            if not got >= bound:
                failures.append(f"worker {r['worker']}: {what} {got:.4f} below the bound {bound}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"server": info, "workers": results, "daemon_pid": dpid,
                       "daemon_pss_kib": daemon_pss, "model": model.name,
                       "resident_bytes": resident.resident_bytes, "users": resident.users,
                       "tensors_bytes": tensors_bytes,
                       "failures": failures}, f, indent=1)
    for f in failures:
        print(f"run.py: {f}", file=sys.stderr)
    if len(results) != args.workers:
        failures.append("not every worker reported")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
