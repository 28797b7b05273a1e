"""Fixtures of the Python tests: a real radianced per test module (or per
test, where the test stops it), clients, the shipped checkpoint.

Environment (tests/run.sh sets them): RADIANCE_BUILD (default build),
RADIANCED (default $RADIANCE_BUILD/radianced), RADIANCE_TEST_DATA (default
tests/data), RADIANCE_TEST_BACKEND (default cpu), RADIANCE_LIBRARY (default
$RADIANCE_BUILD/libradiance.so.0). The package under test is the working
tree's python/, not an installed copy.
"""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _repo_path(p):
    p = Path(p)
    return p if p.is_absolute() else REPO / p


BUILD = _repo_path(os.environ.get("RADIANCE_BUILD", "build"))
RADIANCED = _repo_path(os.environ.get("RADIANCED", BUILD / "radianced"))
DATA = _repo_path(os.environ.get("RADIANCE_TEST_DATA", "tests/data"))
CKPT = DATA / "minilm-w4g128"
BACKEND = os.environ.get("RADIANCE_TEST_BACKEND", "cpu")
# Under a sanitizer build (tests/run.sh preloads its runtime) the daemon's
# kernels run ~20x slower: the long numpy-only checks are skipped and the
# engine runs on fewer sentences.
with open("/proc/self/maps") as _maps:
    SANITIZED = any(("libasan" in l or "libtsan" in l) for l in _maps)
os.environ["RADIANCE_LIBRARY"] = str(_repo_path(os.environ.get("RADIANCE_LIBRARY",
                                                               BUILD / "libradiance.so.0")))
for p in (REPO / "tests", REPO / "examples" / "engine", REPO / "python"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def _die_with_parent():
    # a test process that crashes (a segfault skips every fixture's
    # teardown) takes its daemons with it: PR_SET_PDEATHSIG, SIGKILL
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class Daemon:
    """One radianced on a private socket. start() waits until it accepts
    connections; stop() sends SIGTERM and returns the exit status."""

    def __init__(self, directory, *args, backend=None, env=None):
        self.dir = Path(directory)
        self.env = None if env is None else {**os.environ, **env}   # more variables for radianced
        self.backend = backend or BACKEND
        self.socket = str(self.dir / "radiance.sock")
        self.args = list(args)
        self.proc = None
        self.log_path = self.dir / "radianced.log"

    def start(self, timeout=20.0):
        assert self.proc is None or self.proc.poll() is not None
        log = open(self.log_path, "ab")
        # radianced refuses an option given twice: a default here gives way
        # to the caller's own (as daemon_harness.h's h_args_give)
        defaults = [o for opt, short, v in (("--backend", "-b", self.backend),
                                            ("--log-level", "-l", "info"))
                    if not any(a in (opt, short) or a.startswith(opt + "=") for a in self.args)
                    for o in (opt, v)]
        self.proc = subprocess.Popen(
            [str(RADIANCED), "--no-config", "--socket", self.socket, *defaults, *self.args],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, env=self.env)
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"radianced exited {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect(self.socket)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"radianced did not listen on {self.socket}:\n{self.log()}")
                time.sleep(0.02)

    @property
    def pid(self):
        return self.proc.pid

    def send(self, sig):
        self.proc.send_signal(sig)

    def pause(self, timeout=10.0):
        """SIGSTOP, and wait until every thread of the daemon is stopped:
        from then on nothing submitted completes."""
        self.proc.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        tasks = Path(f"/proc/{self.pid}/task")
        while True:
            states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0]
                      for t in tasks.iterdir()]
            if all(s in "Tt" for s in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"radianced did not stop: thread states {states}")
            time.sleep(0.005)

    def stop(self, sig=signal.SIGTERM, timeout=20.0):
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        if sig != signal.SIGKILL:
            self.proc.send_signal(signal.SIGCONT)
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def _running_daemon(backend=None):
    """A daemon on BACKEND, or on `backend` ("cpu", "gpu")."""
    if not RADIANCED.exists():
        pytest.fail(f"{RADIANCED} is missing: run make first")
    with tempfile.TemporaryDirectory(prefix="radiance-py-") as tmp:
        d = Daemon(tmp, backend=backend).start()
        try:
            yield d
        finally:
            d.stop(signal.SIGKILL)   # no-op when it was stopped already


@pytest.fixture(scope="module")
def daemon():
    """A daemon shared by the tests of one module; it must exit 0 on SIGTERM
    at the end."""
    with _running_daemon() as d:
        yield d
        rc = d.stop()
        if rc != 0:
            print(d.log())
        assert rc == 0, f"radianced exited {rc}"


@pytest.fixture
def own_daemon():
    """A daemon of this test alone (it may stop, restart or pause it)."""
    with _running_daemon() as d:
        yield d


@pytest.fixture
def client(daemon):
    import radiance

    with radiance.Client(daemon.socket, timeout=60) as c:
        yield c


@pytest.fixture
def model(client):
    return client.load(CKPT)


@pytest.fixture(scope="session")
def ckpt_tensors():
    import minilm

    return minilm.CheckpointTensors(str(CKPT))
