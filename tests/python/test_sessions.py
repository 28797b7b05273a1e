"""A Client shared by threads, used across fork(), and across a daemon
restart."""
import errno
import os
import re
import shutil
import signal
import threading
import time

import ml_dtypes
import numpy as np
import pytest

import radiance
from conftest import CKPT

BF16 = ml_dtypes.bfloat16
Q = "encoder.layer.0.attention.self.query"
FFN_IN = "encoder.layer.0.intermediate.dense"


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(BF16)


def bits(a):
    return np.asarray(a).view(np.uint16)


# -- threads ----------------------------------------------------------------------
def test_threads_share_one_client(model):
    """8 threads, one Client: synchronous and asynchronous calls interleaved
    on its one session; every result equals the single-threaded one."""
    xs = [rand((1 + i % 5, 384), seed=i) for i in range(24)]
    layers = [Q if i % 3 else FFN_IN for i in range(24)]
    want = [bits(model.linear(l, x)) for l, x in zip(layers, xs)]
    errors = []
    barrier = threading.Barrier(8)

    def work(t):
        try:
            barrier.wait()
            for rep in range(6):
                for i in range(t, 24, 8):
                    if (rep + i) % 2:
                        got = model.linear(layers[i], xs[i])
                    else:
                        got = model.submit(layers[i], xs[i]).result(timeout=60)
                    if not np.array_equal(bits(got), want[i]):
                        errors.append(f"thread {t} input {i} rep {rep}: wrong result")
        except Exception as e:   # collected: an exception in a thread fails nothing
            errors.append(f"thread {t}: {e!r}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads)
    assert errors == []


def test_one_thread_waits_while_another_submits(model):
    """result() releases the client's lock between its wait slices: a
    thread blocked on a result does not hold up another's calls."""
    x = rand((2, 384), seed=1)
    want = bits(model.linear(Q, x))
    reqs = [model.submit(Q, x) for _ in range(50)]
    done = []
    t = threading.Thread(target=lambda: done.extend(bits(r.result()) for r in reqs))
    t.start()
    for _ in range(20):
        assert np.array_equal(bits(model.linear(Q, x)), want)
    t.join(60)
    assert len(done) == 50 and all(np.array_equal(d, want) for d in done)


# -- fork -------------------------------------------------------------------------
def _in_child(fn, timeout=60.0):
    """Runs fn() in a forked child; returns (exit status, what it raised):
    0 when fn returned True, 2 when it raised, -9 when it hung (killed after
    timeout seconds)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 1
        try:
            os.close(r)
            code = 0 if fn() else 3
        except BaseException as e:
            os.write(w, repr(e).encode())
            code = 2
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    with os.fdopen(r) as f:
        why = f.read()
    return os.waitstatus_to_exitcode(status), why


def test_fork_child_gets_a_fresh_session(client, model):
    x = rand((3, 384), seed=2)
    want = bits(model.linear(Q, x))
    parent_session = client.session_id
    pending = model.submit(FFN_IN, x)    # in flight across the fork

    def child():
        s = client.session_id            # first use: a new session
        assert s != parent_session, (s, parent_session)
        assert np.array_equal(bits(model.linear(Q, x)), want)
        assert np.array_equal(bits(model.submit(Q, x).result()), want)
        with pytest.raises(radiance.RadianceError) as ei:
            pending.result()             # the parent's request
        assert ei.value.errno == errno.ECHILD and "before it forked" in ei.value.message
        return True

    code, why = _in_child(child)
    assert code == 0, why
    # the parent's session is untouched by the child's first use and exit
    assert client.session_id == parent_session
    assert pending.result().shape == (3, 1536)
    assert np.array_equal(bits(model.linear(Q, x)), want)


def test_fork_while_another_thread_holds_the_lock(client, model):
    """A thread inside a call at fork time: the child's lock is a fresh one
    (os.register_at_fork), so the child does not deadlock on it."""
    x = rand((1, 384), seed=3)
    want = bits(model.linear(Q, x))
    held, release = threading.Event(), threading.Event()

    def holder():   # stands for a thread in the middle of a call
        with client._lock:
            held.set()
            release.wait(60)
    t = threading.Thread(target=holder)
    t.start()
    held.wait(10)
    try:
        code, why = _in_child(lambda: np.array_equal(bits(model.linear(Q, x)), want), timeout=10)
    finally:
        release.set()
        t.join()
    assert code == 0, (code, why)


_POOL = {}


def _pool_call(i):
    c, m, x = _POOL["client"], _POOL["model"], _POOL["x"]
    return c.session_id, bits(m.linear(Q, x)).tobytes()


def test_multiprocessing_fork_workers(client, model):
    """multiprocessing's fork workers inherit the Client (through module
    state): each gets its own session on first use."""
    import multiprocessing as mp

    x = rand((2, 384), seed=4)
    want = bits(model.linear(Q, x))
    _POOL.update(client=client, model=model, x=x)
    try:
        with mp.get_context("fork").Pool(2) as pool:
            got = pool.map(_pool_call, range(4))
    finally:
        _POOL.clear()
    assert client.session_id not in {s for s, _ in got}
    assert all(np.array_equal(np.frombuffer(b, np.uint16).reshape(2, 384), want) for _, b in got)


# -- daemon restart ------------------------------------------------------------------
def test_daemon_restart_reconnects_and_reattaches(own_daemon):
    x = rand((4, 384), seed=5)
    c = radiance.Client(own_daemon.socket, timeout=30)
    m = c.load(CKPT)
    a = c.attach("minilm-w4g128")
    assert a is m
    want = bits(m.linear(Q, x))
    assert own_daemon.stop() == 0
    own_daemon.start()
    # the first call after the restart reconnects, loads the model again (the
    # new daemon does not hold it) and succeeds
    assert np.array_equal(bits(m.linear(Q, x)), want)
    assert [r.name for r in c.resident_models()] == ["minilm-w4g128"]
    assert np.array_equal(bits(m.submit(Q, x).result()), want)
    c.close()


def test_daemon_gone_says_why_the_session_ended(own_daemon):
    """The daemon stops and does not come back: the call's one reconnect
    fails, and the error says what ended the session as well as why no new
    one could be had (it used to say only "cannot connect")."""
    c = radiance.Client(own_daemon.socket, timeout=30)
    m = c.load(CKPT)
    x = rand((1, 384), seed=7)
    m.linear(Q, x)
    assert own_daemon.stop() == 0
    with pytest.raises(radiance.RadianceError) as ei:
        m.linear(Q, x)
    msg = ei.value.message
    assert ei.value.errno in (errno.ENOENT, errno.ECONNREFUSED), ei.value
    head, sep, tail = msg.partition("; reconnecting: ")
    assert sep, msg
    assert tail.startswith(f"cannot connect to {own_daemon.socket}"), msg
    assert head and "cannot connect" not in head, msg
    c.close()


def test_attached_model_after_restart_without_it(own_daemon):
    """A model the client only attached (no directory to load it from) and
    that the new daemon does not hold: a clear ENOENT naming it."""
    with radiance.Client(own_daemon.socket) as loader:
        loader.load(CKPT)
        c = radiance.Client(own_daemon.socket)
        m = c.attach("minilm-w4g128")
        x = rand((1, 384), seed=6)
        m.linear(Q, x)
        own_daemon.stop()
        own_daemon.start()
        with pytest.raises(radiance.RadianceError) as ei:
            m.linear(Q, x)
        assert ei.value.errno == errno.ENOENT
        assert "re-attaching model 'minilm-w4g128'" in ei.value.message
        # once some process loads it again, the attached model works again
        with radiance.Client(own_daemon.socket) as again:
            again.load(CKPT)
            assert m.linear(Q, x).shape == (1, 384)
        c.close()


def test_request_in_flight_when_the_daemon_dies(own_daemon):
    x = rand((8, 384), seed=7)
    c = radiance.Client(own_daemon.socket)
    m = c.load(CKPT)
    want = bits(m.linear(Q, x))
    own_daemon.pause()                     # nothing completes from here
    pending = m.submit(Q, x)
    assert not pending.done()
    own_daemon.stop(signal.SIGKILL)
    with pytest.raises(radiance.RadianceError) as ei:
        pending.result(timeout=30)
    e = ei.value
    assert e.errno == errno.ECONNRESET, e
    assert "connection to the daemon was lost" in e.message and "resubmit" in e.message
    assert Q in e.message
    # no daemon: the next call says so
    with pytest.raises(radiance.RadianceError) as ei:
        m.linear(Q, x)
    assert ei.value.errno in (errno.ECONNREFUSED, errno.ENOENT)
    assert own_daemon.socket in ei.value.message
    own_daemon.start()
    assert np.array_equal(bits(m.linear(Q, x)), want)
    c.close()


def test_completed_result_survives_the_connection_loss(own_daemon):
    """A result the daemon delivered before it went away stays readable:
    it is copied out of the arena before the session's memory goes."""
    x = rand((2, 384), seed=8)
    c = radiance.Client(own_daemon.socket)
    m = c.load(CKPT)
    want = bits(m.linear(Q, x))
    r = m.submit(Q, x)
    while not r.done():      # reaped, not read
        pass
    assert own_daemon.stop() == 0
    with pytest.raises(radiance.RadianceError) as ei:
        m.submit(FFN_IN, x).result(timeout=30)   # the lost connection is found here...
    assert ei.value.errno in (errno.ECONNRESET, errno.EPIPE, errno.ESHUTDOWN)
    assert np.array_equal(bits(r.result()), want)   # ...and r's result was saved
    c.close()


# -- ring jobs and other sessions' requests ------------------------------------
def steady_client(m, x, want, stop, done, errors):
    """A thread that sends x to Q on model m until stop is set, appending
    (sent, answered) time.monotonic() pairs to done and any wrong result to
    errors."""
    def run():
        while not stop.is_set():
            t0 = time.monotonic()
            got = m.linear(Q, x)
            done.append((t0, time.monotonic()))
            if not np.array_equal(bits(got), want):
                errors.append("steady client: wrong result")

    return threading.Thread(target=run)


PIN_LINE = re.compile(r"session (\d+): (registering|unregistering) its arena \((\d+) bytes\) "
                      r"took ([0-9.]+) ms \(monotonic ([0-9.]+) to ([0-9.]+) s\)")


def test_ring_pins_run_beside_other_sessions(tmp_path):
    """Clients setting up and tearing down rings one after another, each
    registration and unregistration of their arena sleeping 200 ms in the
    daemon (--test-pin-delay-us, as a GPU's page-locking of a big arena can
    take): a client already serving gets answers while they sleep. The
    daemon logs each registration with its CLOCK_MONOTONIC interval (the
    clock of time.monotonic()); a request of the steady client sent after
    one began and answered before it ended ran entirely inside it. When the
    executor thread did the pinning (a RING_ADD/RING_REMOVE job), no request
    could: 0 for every interval; off it, every interval holds some."""
    from conftest import Daemon

    delay, storms = 0.200, 4
    d = Daemon(tmp_path, "--preload", str(CKPT), "--test-pin-delay-us", str(int(delay * 1e6)),
               "--max-sessions", "16").start()
    try:
        a = radiance.Client(d.socket, timeout=60, name="steady")
        m = a.attach(CKPT.name)
        x = rand((1, 384), seed=5)
        want = bits(m.linear(Q, x))        # its ring is set up (and pinned) first
        done, stop, errors = [], threading.Event(), []
        th = steady_client(m, x, want, stop, done, errors)
        t_start = time.monotonic()
        th.start()
        try:
            for i in range(storms):
                with radiance.Client(d.socket, timeout=60, name=f"storm{i}") as c:
                    c.attach(CKPT.name).linear(Q, x)     # ring set-up, then one request
            # the last teardowns: wait for their lines (the steady client still runs)
            deadline = time.monotonic() + 30
            while True:
                pins = [mt for mt in map(PIN_LINE.search, d.log().splitlines())
                        if mt and float(mt.group(5)) >= t_start]
                if len(pins) >= 2 * storms or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            stop.set()
            th.join(60)
        a.close()
        assert errors == []
        kinds = sorted(mt.group(2) for mt in pins)
        assert kinds == ["registering"] * storms + ["unregistering"] * storms, d.log()
        inside = []
        for mt in pins:
            p0, p1 = float(mt.group(5)), float(mt.group(6))
            assert float(mt.group(4)) >= delay * 1e3, mt.group(0)   # the hook did sleep
            inside.append(sum(1 for t0, t1 in done if p0 <= t0 and t1 <= p1))
        assert min(inside) > 0, (f"steady requests sent and answered inside each "
                                 f"(un)registration: {inside}")
    finally:
        d.stop()


def test_ring_setups_do_not_hold_other_sessions(tmp_path):
    """30 clients setting up and tearing down rings at once, each arena
    registration sleeping 50 ms in the daemon (--test-pin-delay-us, as a GPU's
    page-locking of an arena can take): a client already serving keeps
    getting answers between them. The executor used to run every queued job
    before its next pass, so one M=1 request waited behind all of them (on
    the H200: 3.1 s behind the rings of 1000 killed clients). Measured in
    ring jobs: the sleep is a floor the machine's load cannot shorten, and
    the longest wait may span a few jobs, not the storm (here, before the
    fix: 23-31 jobs). The registrations run off the executor now
    (test_ring_pins_run_beside_other_sessions)."""
    from conftest import Daemon

    delay = 0.050
    d = Daemon(tmp_path, "--preload", str(CKPT), "--test-pin-delay-us", str(int(delay * 1e6)),
               "--max-sessions", "64").start()
    try:
        a = radiance.Client(d.socket, timeout=60, name="steady")
        m = a.attach(CKPT.name)
        x = rand((1, 384), seed=3)
        want = bits(m.linear(Q, x))        # its ring is set up before the storm
        done, stop, errors = [], threading.Event(), []
        barrier = threading.Barrier(30)

        def storm(i):
            try:
                barrier.wait()
                with radiance.Client(d.socket, timeout=60, name=f"storm{i}") as c:
                    c.attach(CKPT.name).linear(Q, x)     # ring set-up, then one request
            except Exception as e:
                errors.append(f"storm client {i}: {e!r}")

        th = steady_client(m, x, want, stop, done, errors)
        th.start()
        time.sleep(0.1)
        t_storm = time.monotonic()
        ths = [threading.Thread(target=storm, args=(i,)) for i in range(30)]
        for t in ths:
            t.start()
        for t in ths:
            t.join(120)
        t_storm = time.monotonic() - t_storm
        stop.set()
        th.join(60)
        a.close()
        assert errors == []
        # the set-ups did sleep: on the executor's pin thread, one after
        # another (the executor only adds the ring)
        assert t_storm >= delay * 0.9
        waits = [t1 - t0 for t0, t1 in done]
        jobs = max(waits) / delay
        assert jobs <= 8, (f"the steady client's longest wait ({max(waits) * 1000:.0f} ms) "
                           f"lasted {jobs:.1f} ring jobs")
    finally:
        d.stop()


def test_model_allocation_runs_beside_other_sessions(tmp_path):
    """A model's one shared allocation (MapModel's) is made on the
    executor's pin thread, not on the executor: with each allocation
    sleeping 1 s in the daemon (--test-pin-delay-us with --fake-share 1, as
    a VMM allocation beside an arena registration took 31.6 ms of the
    executor on the H200), a client already serving keeps getting answers
    while another session's load allocates. On the executor the load's
    first upload step held every session for the whole second. The sleep is
    a floor the machine's load cannot shorten; the steady client's longest
    wait is held to half of it."""
    from conftest import Daemon

    delay = 1.0
    copy = tmp_path / "copy"
    shutil.copytree(CKPT, copy)
    d = Daemon(tmp_path, "--preload", str(CKPT), "--fake-share", "1",
               "--test-pin-delay-us", str(int(delay * 1e6))).start()
    try:
        a = radiance.Client(d.socket, timeout=60, name="steady")
        m = a.attach(CKPT.name)
        x = rand((1, 384), seed=11)
        want = bits(m.linear(Q, x))        # its ring is set up (a 1 s registration) first
        done, stop, errors = [], threading.Event(), []
        th = steady_client(m, x, want, stop, done, errors)
        th.start()
        try:
            time.sleep(0.1)
            t0 = time.monotonic()
            with radiance.Client(d.socket, timeout=60, name="loader") as b:
                b.load(str(copy), name="second").close()
            t_load = time.monotonic() - t0
        finally:
            stop.set()
            th.join(60)
        a.close()
        assert errors == []
        assert t_load >= delay * 0.9, t_load      # the allocation did sleep
        during = [t1 - s0 for s0, t1 in done if s0 >= t0 and t1 <= t0 + t_load]
        assert len(during) > 0
        assert max(during) < delay / 2, (f"the steady client waited {max(during) * 1e3:.0f} ms "
                                         f"during a load whose allocation slept {delay * 1e3:.0f} ms")
    finally:
        d.stop()


def test_loads_do_not_wait_for_ring_setups(tmp_path):
    """Arena registrations run on the executor's own pin thread, not on
    libuv's threadpool, where checkpoint loads run: with one threadpool
    worker (UV_THREADPOOL_SIZE=1) and a registration that sleeps 3 s
    (--test-pin-delay-us, as a GPU's page-locking of a big arena can take),
    a load asked for while a ring set-up sleeps is answered before that
    set-up is. On the shared pool the load waited for the registration to
    end (and a ring set-up waited for loads: 12 s behind four 0.95 GB ones).
    An order of events, not a time: the sleep is a floor the machine's load
    cannot shorten, the load of this small checkpoint takes well under it."""
    from conftest import Daemon

    copy = tmp_path / "copy"
    shutil.copytree(CKPT, copy)
    d = Daemon(tmp_path, "--test-pin-delay-us", "3000000",
               env={"UV_THREADPOOL_SIZE": "1"}).start()
    try:
        events, errors = [], []
        a = radiance.Client(d.socket, timeout=120, name="ring")
        m = a.load(str(CKPT))
        x = rand((1, 384), seed=9)

        def ring_client():
            try:
                m.linear(Q, x)            # the ring's set-up: a 3 s registration
                events.append("ring set up")
            except Exception as e:
                errors.append(repr(e))

        t = threading.Thread(target=ring_client)
        t.start()
        # let its OpenRing reach the daemon and the registration begin (if
        # the load got there first, it runs first either way: the order
        # below holds then too, the check just sees nothing)
        time.sleep(0.5)
        with radiance.Client(d.socket, timeout=120, name="loader") as b:
            b.load(str(copy), name="second")    # other files: a load, not the same model again
            events.append("loaded")
        t.join(60)
        assert errors == []
        assert events == ["loaded", "ring set up"], (events, d.log())
        a.close()
    finally:
        d.stop()
