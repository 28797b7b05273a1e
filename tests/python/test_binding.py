"""The radiance package's checks and plumbing against a real daemon: what is
refused before it reaches the daemon (dtype, K, out=, closed handles), that
layouts the C API cannot take (non-contiguous, transposed, broadcast) give
the same bits as their contiguous copies, shapes, splitting, async, errors
carrying the daemon's text."""
import errno
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import ml_dtypes

import numpy as np
import pytest

import radiance
from radiance import _lib
from conftest import CKPT, REPO

BF16 = ml_dtypes.bfloat16
Q = "encoder.layer.0.attention.self.query"      # N = K = 384
FFN_IN = "encoder.layer.0.intermediate.dense"   # N = 1536, K = 384


def rand(shape, seed=0, dtype=BF16):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32).astype(dtype)


def bits(a):
    return np.asarray(a).view(np.uint16)


# -- the library and its declarations -----------------------------------------
def test_cdefs_are_the_header_and_declare_every_export():
    ffi, lib = _lib.load()
    # libradiance.sym takes radiance_* by pattern: the list is the library's
    nm = subprocess.run(["nm", "-D", "--defined-only", radiance.library_path()],
                        check=True, capture_output=True, text=True).stdout
    exported = re.findall(r" T (radiance_\w+)@", nm)
    assert len(exported) >= 30
    missing = [f for f in exported if not hasattr(lib, f)]
    assert missing == []
    # the packaged header is client/radiance.h (a symlink in the tree)
    packaged = (REPO / "python/radiance/radiance.h").read_text()
    assert packaged == (REPO / "client/radiance.h").read_text()
    # the option struct's size is what the library itself checks (`size`):
    # a field cffi got wrong would move `timeout_ms`, the last one
    assert ffi.offsetof("struct radiance_options", "timeout_ms") + 4 <= \
        ffi.sizeof("struct radiance_options")


def test_library_from_env_and_a_wrong_path(tmp_path):
    assert radiance.library_path() == os.environ["RADIANCE_LIBRARY"]
    assert radiance.library_version() == "0.1.0"
    code = ("import radiance\ntry:\n    radiance.Client('/nonexistent')\n"
            "except radiance.RadianceError as e:\n    print(e.code, e.message)\n")
    import subprocess
    import sys
    env = dict(os.environ, RADIANCE_LIBRARY=str(tmp_path / "libnothere.so.0"),
               PYTHONPATH=str(REPO / "python"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ENOENT cannot load $RADIANCE_LIBRARY=")
    assert "libnothere.so.0" in out.stdout


def test_library_from_the_system_loader(tmp_path):
    import subprocess
    import sys
    code = ("import radiance\ntry:\n    print(radiance.library_path())\n"
            "except radiance.RadianceError as e:\n    print(e.code, e.message)\n")
    env = {k: v for k, v in os.environ.items() if k != "RADIANCE_LIBRARY"}
    env["PYTHONPATH"] = str(REPO / "python")
    env["LD_LIBRARY_PATH"] = os.path.dirname(os.environ["RADIANCE_LIBRARY"])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "libradiance.so.0", out.stdout + out.stderr
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.stdout.strip() != "libradiance.so.0":   # (unless make install put one there)
        assert out.stdout.startswith("ENOENT cannot find libradiance: tried $RADIANCE_LIBRARY "
                                     "(not set);"), out.stdout
        assert "RADIANCE_LIBRARY=build/libradiance.so.0" in out.stdout


def test_connect_failures_name_the_socket(tmp_path):
    with pytest.raises(radiance.RadianceError) as ei:
        radiance.Client(tmp_path / "none.sock")
    assert ei.value.errno == errno.ENOENT
    assert str(tmp_path / "none.sock") in ei.value.message
    assert "is radianced running?" in ei.value.message
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(radiance.RadianceError) as ei:
        radiance.Client(f)
    assert ei.value.errno == errno.ENOTSOCK
    with pytest.raises(radiance.RadianceError) as ei:
        radiance.Client(f, timeout=-1)
    assert ei.value.errno == errno.EINVAL and "timeout" in ei.value.message


def test_strings_with_a_nul_are_refused_not_cut(daemon, client):
    # libradiance takes C strings: a NUL would end one early, and the call
    # would name another socket, model, directory (it used to: attach("m\0x")
    # attached m, load(dir + "\0x") loaded dir)
    m = client.load(CKPT)
    calls = [
        ("socket", lambda: radiance.Client(daemon.socket + "\0x")),
        ("socket", lambda: radiance.Client(os.fsencode(daemon.socket) + b"\0x")),
        ("name", lambda: radiance.Client(daemon.socket, name="engine\0x")),
        ("model name", lambda: client.attach(m.name + "\0x")),
        ("directory", lambda: client.load(str(CKPT) + "\0x")),
        ("name", lambda: client.load(CKPT, name="other\0x")),
    ]
    for what, call in calls:
        with pytest.raises(radiance.RadianceError) as ei:
            call()
        assert ei.value.errno == errno.EINVAL, (what, ei.value)
        assert f"{what} " in ei.value.message and "NUL" in ei.value.message, ei.value.message
    assert [r.name for r in client.resident_models()] == [m.name]
    # the socket may be bytes (os.fspath's other kind); names are str
    with radiance.Client(os.fsencode(daemon.socket)) as c:
        assert c.attach(m.name).layers == m.layers
    for call in (lambda: radiance.Client(daemon.socket, name=5),
                 lambda: client.load(CKPT, name=5)):
        with pytest.raises(radiance.RadianceError) as ei:
            call()
        assert ei.value.errno == errno.EINVAL and "must be a str" in ei.value.message


@pytest.mark.parametrize("kw", [dict(sq_entries=2**32), dict(cq_entries=2**40),
                                dict(arena_bytes=2**64), dict(spin_us=2**31),
                                dict(spin_us=-2), dict(timeout=1e12), dict(timeout=0)])
def test_client_sizes_beyond_the_c_fields_are_einval(tmp_path, kw):
    # each is checked against its radiance_options field before anything is
    # sent (it used to be cffi's OverflowError, naming the C type only)
    (k, v), = kw.items()
    with pytest.raises(radiance.RadianceError) as ei:
        radiance.Client(tmp_path / "none.sock", **kw)
    assert ei.value.errno == errno.EINVAL
    assert ei.value.message.startswith(f"{k} must be") and repr(v) in ei.value.message


def test_result_timeout_must_be_a_number(model):
    r = model.submit(Q, rand((2, 384)))
    for bad in (float("nan"), "1", [1]):
        with pytest.raises(radiance.RadianceError) as ei:
            r.result(timeout=bad)
        assert ei.value.errno == errno.EINVAL
        assert ei.value.message == f"timeout must be a number of seconds or None, not {bad!r}"
    # the request is still there; a negative timeout is 0: a poll
    y = r.result(timeout=30)
    assert r.result(timeout=-1) is y


def _client_in_a_child(code, as_nobody=False):
    """Runs `code` (radiance imported, no logging configured) in a fresh
    interpreter, as uid 65534 through setpriv when as_nobody."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    argv = [sys.executable, "-c", "import radiance\n" + code]
    if as_nobody:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + argv
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_permission_denied_says_who_may_connect():
    # a socket that is there but not this user's: libradiance's message says
    # what lets a user in (radiancectl shows the same text)
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("as root this needs setpriv to connect as another uid")
    if os.geteuid() == 0:
        probe = _client_in_a_child("", as_nobody=True)
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or [""])[-1]
            # a checkout or venv below a mode-0700 directory (mktemp -d):
            # Python passes over the path entries it cannot read
            if "No module named" not in last and "Permission denied" not in last:
                pytest.fail(f"uid 65534 cannot run the client: {probe.stderr}")
            pytest.skip(f"uid 65534 cannot import radiance from this checkout and venv (a "
                        f"directory above them is not searchable by others): {last}")
    d = tempfile.mkdtemp(prefix="radiance-eacces-")
    try:
        os.chmod(d, 0o711)
        path = os.path.join(d, "r.sock")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as ls:
            ls.bind(path)
            ls.listen(1)
            os.chmod(path, 0o600 if os.geteuid() == 0 else 0)
            code = (f"try:\n    radiance.Client({path!r})\n"
                    "except radiance.RadianceError as e:\n    print(e.code)\n    print(e.message)\n"
                    "import os\nprint(os.geteuid())\n")
            out = _client_in_a_child(code, as_nobody=os.geteuid() == 0)
    finally:
        shutil.rmtree(d)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 3, out.stdout + out.stderr
    code, message, uid = lines
    assert code == "EACCES"
    assert message.startswith(f"cannot connect to {path}: Permission denied: uid {uid} may "
                              "not connect"), message
    for needle in ("radianced's --group", "config key group", "SocketGroup="):
        assert needle in message, message
    assert "is radianced running" not in message
    assert out.stderr == ""   # raised, not also printed


def test_connect_failure_is_raised_not_also_printed(tmp_path):
    # with no logging configured, logging's last-resort handler printed the
    # library's warning before the traceback said it again
    path = str(tmp_path / "none.sock")
    out = _client_in_a_child(f"radiance.Client({path!r})")
    assert out.returncode == 1
    assert "RadianceError" in out.stderr
    assert out.stderr.count(f"cannot connect to {path}") == 1, out.stderr


def test_library_warnings_reach_the_radiance_logger(client, tmp_path, caplog):
    # with logging configured, a failure that is raised is not logged as a
    # warning too, while a warning with no return code to say it is
    with caplog.at_level(logging.DEBUG, logger="radiance"):
        with pytest.raises(radiance.RadianceError):
            radiance.Client(tmp_path / "none.sock")
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
        s = client._sess()
        client._lib.radiance_arena_free(s.h, client._ffi.cast("void *", 4096))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(r.name, r.getMessage()) for r in warned] == \
        [("radiance", "radiance_arena_free(0x1000): not an arena block")]


def test_default_socket_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("RADIANCE_SOCKET", str(tmp_path / "x.sock"))
    assert radiance.default_socket_path() == str(tmp_path / "x.sock")
    # a $RADIANCE_DEVICE that is no GPU ordinal names no socket: said so
    # (it used to be "the default socket path ($RADIANCE_SOCKET) is too long")
    monkeypatch.delenv("RADIANCE_SOCKET")
    monkeypatch.setenv("RADIANCE_DEVICE", "x1")
    for call in (radiance.default_socket_path, radiance.Client):
        with pytest.raises(radiance.RadianceError) as ei:
            call()
        assert ei.value.errno == errno.EINVAL
        assert ei.value.message.startswith("$RADIANCE_DEVICE is 'x1', not a GPU ordinal"), \
            ei.value.message
    monkeypatch.setenv("RADIANCE_DEVICE", "3")
    assert radiance.default_socket_path() == "/run/radiance/radiance-3.sock"


# -- models ---------------------------------------------------------------------
def test_load_layers_progress_and_repr(client):
    seen = []
    m = client.load(CKPT, progress=lambda done, total: seen.append((done, total)))
    assert m.name == "minilm-w4g128"
    assert len(m.layers) == 37
    assert [l.index for l in m.layers] == list(range(37))
    q = m.layer(Q)
    assert (q.name, q.kind, q.N, q.K, q.bias) == (Q, "w4a8", 384, 384, True)
    assert m.layer(q.index) is q and m.layer(q) is q
    assert m.layer("pooler.dense").kind == "bf16"
    assert m.layer(FFN_IN)[3:5] == (1536, 384)
    assert {t.name for t in m.other_tensors} >= {"embeddings.word_embeddings.weight"}
    assert seen and seen[-1][0] == seen[-1][1] > 0
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    assert repr(m) == "<radiance.Model 'minilm-w4g128' 37 layers>"
    assert "session" in repr(client) and "backend" in repr(client)
    # one Model per name: loading again, or attaching, gives the same object
    assert client.load(CKPT) is m and client.attach("minilm-w4g128") is m
    assert [r.name for r in client.resident_models()] == ["minilm-w4g128"]


def test_layer_lookup_errors(model):
    with pytest.raises(radiance.RadianceError) as ei:
        model.layer("encoder.layer.9.attention.self.query")
    assert ei.value.errno == errno.ENOENT and "no layer 'encoder.layer.9" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        model.linear(37, rand((1, 384)))
    assert ei.value.errno == errno.ENOENT and "0..36" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        model.linear(1.5, rand((1, 384)))
    assert ei.value.errno == errno.EINVAL


def test_daemon_errors_carry_its_text(client, tmp_path):
    with pytest.raises(radiance.RadianceError) as ei:
        client.attach("no-such-model")
    assert ei.value.errno == errno.ENOENT
    assert "no-such-model" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        client.load(tmp_path / "empty")
    assert ei.value.errno == errno.ENOENT and str(tmp_path / "empty") in ei.value.message
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("config.json", "quantization_config.json"):
        (bad / f).write_bytes((CKPT / f).read_bytes())
    (bad / "model.safetensors").write_bytes(b"\xff\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(radiance.RadianceError) as ei:
        client.load(bad)
    assert ei.value.errno == errno.EINVAL
    assert "model.safetensors" in ei.value.message   # the daemon's reason
    assert str(ei.value).endswith("[EINVAL]")
    # the session goes on
    assert client.load(CKPT).linear(Q, rand((1, 384))).shape == (1, 384)


@pytest.mark.parametrize("name, why", [
    (" ", '" " begins with a space'), ("..", '".." is a directory\'s name'),
    ("a/b", "\"a/b\" has a '/' at byte 1"), ("x" * 256, "is 256 bytes long"),
    ("bell\x07", "has a control character (0x07) at byte 4")])
def test_model_names_the_daemon_refuses(client, name, why):
    # the daemon's rule, the same for every client: the name and the rule
    with pytest.raises(radiance.RadianceError) as ei:
        client.load(CKPT, name=name)
    assert ei.value.errno == errno.EINVAL
    assert "LoadModel.name" in ei.value.message and why in ei.value.message, ei.value.message
    assert re.search(r"; a (model )?name (is|must)", ei.value.message)   # and the rule
    with pytest.raises(radiance.RadianceError) as ei:
        client.attach(name)
    assert ei.value.errno == errno.EINVAL and "AttachModel.name" in ei.value.message
    assert name not in [r.name for r in client.resident_models()]


def test_progress_exception_is_reraised_after_the_load(client):
    class Stop(Exception):
        pass

    def progress(done, total):
        raise Stop()

    with pytest.raises(Stop):
        client.load(CKPT, progress=progress)
    # the model was released, the client still works
    assert "minilm-w4g128" not in [m.name for m in client.resident_models() if m.users]
    assert client.load(CKPT).linear(0, rand((2, 384))).shape == (2, 384)


def test_calls_from_the_clients_own_callbacks_are_refused(own_daemon):
    # A progress callback or a logging handler runs inside one of the
    # client's calls: a call back into the client is EDEADLK, and the call
    # running the callback goes on. (It used to nest into libradiance's
    # call: the attach broke the session with EPROTO, and a close() there
    # freed the handle under the load: a crash.)
    seen = []

    def try_calls(where):
        for what, call in (("attach", lambda: client.attach("minilm-w4g128")),
                           ("models", client.resident_models), ("close", client.close)):
            try:
                call()
                seen.append((where, what, "returned"))
            except radiance.RadianceError as e:
                seen.append((where, what, e.code))
                assert f"called from inside its own {where}" in e.message, e.message

    def progress(done, total):
        if not seen:
            try_calls("load progress callback")

    class Reenter(logging.Handler):
        def emit(self, record):
            if "no-such-model" in record.getMessage() and len(seen) == 3:
                try_calls("logging handler")

    handler = Reenter()
    logger = logging.getLogger("radiance")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)   # the client asks libradiance for everything
    try:
        client = radiance.Client(socket=own_daemon.socket, timeout=30)
        m = client.load(CKPT, progress=progress)
        assert seen == [("load progress callback", w, "EDEADLK")
                        for w in ("attach", "models", "close")]
        with pytest.raises(radiance.RadianceError) as ei:
            client.attach("no-such-model")   # logged by libradiance as it fails
        assert ei.value.errno == errno.ENOENT
        assert seen[3:] == [("logging handler", w, "EDEADLK")
                            for w in ("attach", "models", "close")]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    # the client was not closed under the load, nor broken by the calls
    assert m.linear(Q, rand((2, 384))).shape == (2, 384)
    client.close()


# -- argument checks ----------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int16, np.uint16,
                                   ml_dtypes.float8_e4m3fn])
def test_wrong_dtype_is_refused(model, dtype):
    x = np.zeros((3, 384), dtype)
    with pytest.raises(radiance.RadianceError) as ei:
        model.linear(Q, x)
    e = ei.value
    assert e.errno == errno.EINVAL
    assert f"x has dtype {np.dtype(dtype)}" in e.message and Q in e.message
    with pytest.raises(radiance.RadianceError):
        model.submit(Q, x)


def test_wrong_k_is_refused(model):
    for shape in [(2, 383), (2, 1536), (384, 2), (7,)]:
        with pytest.raises(radiance.RadianceError) as ei:
            model.linear(Q, np.zeros(shape, BF16))
        assert ei.value.errno == errno.EINVAL
        assert f"shape {shape}" in ei.value.message and "K=384" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        model.linear(Q, np.zeros((), BF16))
    assert "scalar" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        model.linear(Q, [[0.0] * 384])
    assert "numpy.ndarray or a torch.Tensor, not list" in ei.value.message


def test_noncontiguous_and_transposed_inputs_are_copied(model):
    base = rand((6, 384), seed=1)
    want = bits(model.linear(Q, base))
    big = rand((384, 12), seed=2)
    cases = {
        "transposed": (big.T, np.ascontiguousarray(big.T)),
        "row slice": (rand((12, 384), seed=3)[::2], None),
        "column slice": (rand((6, 768), seed=4)[:, ::2], None),
        "negative stride": (base[::-1], None),
        "broadcast": (np.broadcast_to(base[0], (5, 384)), None),
        "fortran order": (np.asfortranarray(base), None),
        "3-d transposed": (rand((384, 2, 3), seed=5).transpose(1, 2, 0), None),
    }
    for name, (x, _) in cases.items():
        assert not x.flags.c_contiguous, name
        got = model.linear(Q, x)
        ref = model.linear(Q, np.ascontiguousarray(x))
        assert got.shape == x.shape[:-1] + (384,), name
        assert np.array_equal(bits(got), bits(ref)), name
        assert np.array_equal(bits(model.submit(Q, x).result()), bits(ref)), name
    # and the fortran copy of base is base
    assert np.array_equal(bits(model.linear(Q, np.asfortranarray(base))), want)


def test_contiguous_inputs_are_sent_as_they_are_and_subclasses_as_arrays(model, tmp_path):
    # a C-contiguous [rows, K] array is what the C call gets, without a copy
    # (the per-call fast path); an ndarray subclass (a memmap here) is taken
    # as the plain array of its data, as np.ascontiguousarray gives it
    x = rand((5, 384), seed=11)
    layer = model.layer(Q)
    p = model._prepare(layer, x, None)
    assert p.x.shape == (5, 384) and np.shares_memory(p.x, x)
    assert p.y.shape == (5, layer.N) and p.result.shape == (5, layer.N)
    x3 = rand((2, 3, 384), seed=12)
    p3 = model._prepare(layer, x3, None)
    assert p3.x.shape == (6, 384) and np.shares_memory(p3.x, x3) and p3.result.shape == (2, 3, 384)
    mm = np.memmap(tmp_path / "x.bin", dtype=BF16, mode="w+", shape=(5, 384))
    mm[...] = x
    assert np.array_equal(bits(model.linear(Q, mm)), bits(model.linear(Q, x)))
    assert type(model._prepare(layer, mm, None).x) is np.ndarray


def test_byteswapped_fp16_is_converted(model):
    x = rand((4, 384), seed=6, dtype=np.float16)
    want = bits(model.linear(Q, x))
    assert np.array_equal(bits(model.linear(Q, x.astype(">f2"))), want)


def test_fp16_and_bf16_of_the_same_values_agree(model):
    # values exact in both formats (small integers / 8) give the same codes
    x = (np.random.default_rng(7).integers(-64, 64, (5, 384)) / 8.0).astype(np.float32)
    y16 = model.linear(Q, x.astype(np.float16))
    yb = model.linear(Q, x.astype(BF16))
    assert np.array_equal(bits(y16), bits(yb))


def test_out_must_be_right(model):
    x = rand((2, 3, 384), seed=8)
    out = np.empty((2, 3, 384), BF16)
    r = model.linear(Q, x, out=out)
    assert r is out
    assert np.array_equal(bits(out), bits(model.linear(Q, x)))
    bad = {
        "dtype float32": np.empty((2, 3, 384), np.float32),
        "shape (6, 384)": np.empty((6, 384), BF16),
        "not C-contiguous": np.empty((2, 3, 768), BF16)[..., ::2],
        "shape (2, 3, 1536)": np.empty((2, 3, 1536), BF16),
    }
    ro = np.empty((2, 3, 384), BF16)
    ro.flags.writeable = False
    bad["read-only"] = ro
    for what, o in bad.items():
        with pytest.raises(radiance.RadianceError) as ei:
            model.linear(Q, x, out=o)
        assert ei.value.errno == errno.EINVAL
        assert what in ei.value.message, (what, ei.value.message)
        assert "(2, 3, 384)" in ei.value.message
    with pytest.raises(radiance.RadianceError) as ei:
        model.linear(Q, x, out=x)
    assert "overlaps x" in ei.value.message


def test_shapes_and_row_splitting(client, model):
    max_rows = client.server_info["max_rows"]
    x = rand((max_rows * 2 + 37, 384), seed=9)   # three daemon requests
    y = model.linear(FFN_IN, x)
    assert y.shape == (x.shape[0], 1536) and y.dtype == BF16
    # row by row the same (rows are independent: per-token scales)
    for i in (0, max_rows - 1, max_rows, x.shape[0] - 1):
        assert np.array_equal(bits(model.linear(FFN_IN, x[i])), bits(y[i]))
    a = model.submit(FFN_IN, x)
    assert np.array_equal(bits(a.result()), bits(y))
    assert model.linear(Q, np.zeros((0, 384), BF16)).shape == (0, 384)
    assert model.submit(Q, np.zeros((3, 0, 384), BF16)).result().shape == (3, 0, 384)
    x4 = rand((2, 2, 2, 384), seed=10)
    assert np.array_equal(bits(model.linear(Q, x4)).reshape(8, 384),
                          bits(model.linear(Q, x4.reshape(8, 384))))


def test_async_requests_in_any_order(model):
    xs = [rand((i + 1, 384), seed=20 + i) for i in range(40)]
    want = [bits(model.linear(Q if i % 2 else FFN_IN, x)) for i, x in enumerate(xs)]
    reqs = [model.submit(Q if i % 2 else FFN_IN, x) for i, x in enumerate(xs)]
    for i in reversed(range(len(reqs))):
        assert np.array_equal(bits(reqs[i].result(timeout=30)), want[i])
        assert reqs[i].result() is reqs[i].result()    # read once, kept
    r = model.submit(Q, xs[0], out=np.empty((1, 384), BF16))
    assert r.result().shape == (1, 384)
    assert "read" in repr(r)


def test_request_reports_the_daemons_times(client, model):
    max_rows = client.server_info["max_rows"]
    x = rand((max_rows + 5, 384), seed=11)       # two daemon requests
    t0 = time.monotonic_ns()
    r = model.submit(FFN_IN, x)
    assert r.queue_ns is None and r.exec_ns is None
    r.result(timeout=30)
    wall = time.monotonic_ns() - t0
    # the daemon timed its parts; the longest part's account fits inside the
    # client's wait (both clocks are CLOCK_MONOTONIC)
    assert r.exec_ns > 0 and r.queue_ns >= 0
    assert r.queue_ns + r.exec_ns <= wall


def test_dropped_requests_give_their_arena_back(daemon):
    # a 256 KiB arena holds x and y of two 64-row requests (96 KiB each):
    # 100 requests dropped unread must not leak theirs
    with radiance.Client(daemon.socket, arena_bytes=256 << 10) as c:
        m = c.load(CKPT)
        x = rand((64, 384), seed=11)
        want = bits(m.linear(Q, x))
        for _ in range(100):
            m.submit(Q, x)
        assert np.array_equal(bits(m.submit(Q, x).result()), want)


def test_arena_exhaustion_is_a_clear_error(daemon):
    with radiance.Client(daemon.socket, arena_bytes=1 << 20) as c:
        m = c.load(CKPT)
        x = rand((100, 384), seed=3)
        reqs = []
        with pytest.raises(radiance.RadianceError) as ei:
            for _ in range(10):
                reqs.append(m.submit(FFN_IN, x))     # 384 KiB of x and y each
        assert len(reqs) == 2 and ei.value.errno == errno.ENOMEM
        assert "arena" in ei.value.message and "arena_bytes" in ei.value.message
        for r in reqs:
            r.result()
        # synchronous calls split to fit the arena
        assert m.linear(FFN_IN, rand((600, 384))).shape == (600, 1536)


def test_arena_too_small_for_one_split_request(daemon):
    # x of three max_rows pieces of FFN_IN: each piece fits the 4 MiB arena,
    # all three at once do not. No other request is in flight, so the message
    # must say that the earlier pieces of this same request hold the arena
    arena = 4 << 20
    with radiance.Client(daemon.socket, arena_bytes=arena) as c:
        m = c.load(CKPT)
        step = c.server_info["max_rows"]
        piece = step * (384 + 1536) * 2
        rows = 3 * step
        need = rows * (384 + 1536) * 2
        assert piece < arena // 2 < arena < need
        with pytest.raises(radiance.RadianceError) as ei:
            m.submit(FFN_IN, rand((rows, 384), seed=4))
        assert ei.value.errno == errno.ENOMEM
        msg = ei.value.message
        assert f"rows {2 * step}..{rows - 1} of this request's {rows}" in msg
        assert f"it needs {need} bytes of x and y at once, in 3 pieces" in msg
        assert "2 placed" in msg and "linear() splits to fit" in msg
        # nothing leaked: the same arena serves the rows through linear()
        assert m.linear(FFN_IN, rand((rows, 384))).shape == (rows, 1536)


def test_closed_client_and_released_model(daemon):
    c = radiance.Client(daemon.socket)
    m = c.load(CKPT)
    x = rand((1, 384))
    pending = m.submit(Q, x)
    m2 = c.attach("minilm-w4g128")
    assert m2 is m
    c.close()
    assert "closed" in repr(c)
    for call in (lambda: m.linear(Q, x), lambda: m.submit(Q, x), lambda: c.attach("x"),
                 lambda: c.load(CKPT), lambda: c.server_info):
        with pytest.raises(radiance.RadianceError) as ei:
            call()
        assert ei.value.errno == errno.EBADF
    with pytest.raises(radiance.RadianceError) as ei:
        pending.result()
    assert ei.value.errno == errno.EBADF and "closed" in ei.value.message
    c.close()   # no-op

    with radiance.Client(daemon.socket) as c2:
        with c2.load(CKPT) as m3:
            r = m3.submit(Q, x)
            assert m3.linear(Q, x).shape == (1, 384)
        # close() waited for r; the model is released
        assert r.result().shape == (1, 384)
        with pytest.raises(radiance.RadianceError) as ei:
            m3.linear(Q, x)
        assert ei.value.errno == errno.EBADF and "released" in ei.value.message
        assert "released" in repr(m3)
        # a released name can be opened again
        assert c2.load(CKPT).linear(Q, x).shape == (1, 384)


def test_error_type():
    e = radiance.RadianceError(-errno.EINVAL, "bad x")
    assert (e.errno, e.code, e.message) == (errno.EINVAL, "EINVAL", "bad x")
    assert str(e) == "bad x [EINVAL]" and "EINVAL" in repr(e)
    import pickle
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.errno, e2.message) == (e.errno, e.message)
