"""A CI-sized run of tests/chaos.py (make chaos runs the full one): 60
clients SIGKILLed in the handshake, in a load, with requests in flight and
in a MapModel / MapTensors exchange, clients that never reap their CQ or
never read their socket (the daemon must idle while only they are left), a
flooder, truncated loads and checked clients against one daemon; every
checked result must be bit-exact and the daemon's descriptors, shared-memory
mappings, RSS, sessions and models back to the baseline afterwards. The wait
bound is 30 s here: a hang detector, not a speed check."""
import subprocess
import sys

import pytest

from conftest import REPO, SANITIZED


@pytest.mark.skipif(SANITIZED, reason="a sanitizer's quarantine and shadow memory "
                    "make the RSS baseline meaningless, and it runs ~20x slower")
def test_chaos_small():
    p = subprocess.run([sys.executable, str(REPO / "tests" / "chaos.py"), "--clients", "60",
                        "--parallel", "8", "--flooders", "1", "--wb", "2", "--truncators", "1",
                        "--truncations", "4", "--seconds", "30", "--no-canary"],
                       capture_output=True, text=True, timeout=300)
    print(p.stdout[-3000:], p.stderr[-6000:])
    assert p.returncode == 0, p.stderr[-2000:]
    assert "chaos: PASS: 60 killers" in p.stdout
