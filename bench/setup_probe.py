#!/usr/bin/env python3
"""How long a new client's connect, ring set-up and first M=1 request take on
one daemon, quiet and while flooders keep max-row requests in flight on its
largest layer (tests/chaos.py's flood role), for each `pin_piece_kib` given:
the cost side of smaller registration pieces (docs/daemon.md "Chaos test").

  python3 bench/setup_probe.py [--backend gpu] [--pieces 1024,256] [--n 20]

Prints one line per (pieces, load): p50 and max in ms. Env: as tests/chaos.py
(RADIANCE_BUILD for the binaries)."""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "tests"
sys.path[:0] = [str(HERE / "python"), str(HERE), str(HERE.parent / "python")]

import numpy as np  # noqa: E402

import conftest  # noqa: E402
import radiance  # noqa: E402
from chaos import BF16, MODEL, gpu_env  # noqa: E402


def one_setup(sock):
    t0 = time.monotonic()
    with radiance.Client(sock, timeout=120, name="setup-probe") as c:
        m = c.attach(MODEL)
        lay = min((l for l in m.layers if l.kind == "w4a8"), key=lambda l: l.N * l.K)
        m.linear(lay.index, np.ones((1, lay.K), BF16))
        t = time.monotonic() - t0
        m.close()
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--pieces", default="1024,256")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--flooders", type=int, default=2)
    ap.add_argument("--eager-modules", action="store_true",
                    help="gpu: the daemon with CUDA_MODULE_LOADING=EAGER (as tests/chaos.py)")
    a = ap.parse_args()
    for kib in a.pieces.split(","):
        tmp = tempfile.mkdtemp(prefix="radiance-setup-")
        d = conftest.Daemon(tmp, "--preload", str(conftest.CKPT), "--backend", a.backend,
                            "--log-level", "warn", "--pin-piece-kib", kib, env=gpu_env(a)).start()
        stop = Path(tmp) / "stop"
        try:
            one_setup(d.socket)   # warm-up
            quiet = [one_setup(d.socket) for _ in range(a.n)]
            fl = [subprocess.Popen([sys.executable, str(HERE / "chaos.py"), "--role", "flood",
                                    "--args", json.dumps([d.socket, str(stop),
                                                          str(Path(tmp) / f"fl{i}.json")])],
                                   preexec_fn=conftest._die_with_parent)
                  for i in range(a.flooders)]
            time.sleep(1.0)
            loaded = [one_setup(d.socket) for _ in range(a.n)]
            stop.touch()
            for p in fl:
                p.wait(120)
        finally:
            d.stop()
        for name, v in (("quiet", quiet), (f"{a.flooders} flooders", loaded)):
            print(f"setup-probe: pin_piece_kib {kib}, {name}: connect + ring + first M=1 "
                  f"p50 {np.median(v) * 1e3:.1f} ms, max {max(v) * 1e3:.1f} ms (n={len(v)})")


if __name__ == "__main__":
    main()
