"""Shared tensors from Python (Model.tensors, Model.tensor): the listing
against the model's inventory, values against the checkpoint file read here
with json + plain file reads, read-only views, one copy of the pages for two
processes (same memfd inode; same page frame where /proc/self/pagemap shows
it), and the daemon letting go of the memfd with the model while a view keeps
its bytes."""
import errno
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import radiance
from conftest import CKPT, REPO

NP = {"BF16": ml_dtypes.bfloat16, "F16": np.float16, "F32": np.float32, "I64": np.int64}


def file_tensors(path):
    """name -> (dtype, shape, raw bytes) of a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        out = {}
        for name, t in header.items():
            if name == "__metadata__":
                continue
            b, e = t["data_offsets"]
            f.seek(8 + n + b)
            out[name] = (t["dtype"], tuple(t["shape"]), f.read(e - b))
        return out


def memfds_of(pid):
    """fds of pid that are a shared-tensors memfd."""
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            n += "memfd:radiance-tensors:" in os.readlink(fd)
        except OSError:
            pass
    return n


def test_listing_matches_the_inventory_and_the_file(model):
    tensors = model.tensors
    assert [t.name for t in tensors] == [o.name for o in model.other_tensors]
    assert [(t.dtype, t.shape) for t in tensors] == [(o.dtype, o.shape) for o in model.other_tensors]
    assert len(tensors) >= 5
    ft = file_tensors(CKPT / "model.safetensors")
    for t in tensors:
        dtype, shape, raw = ft[t.name]
        assert (t.dtype, t.shape, t.bytes) == (dtype, shape, len(raw))
        assert t.offset % 64 == 0
        a = model.tensor(t.name)
        assert a.dtype == np.dtype(NP[dtype]) and a.shape == shape
        assert a.tobytes() == raw, t.name     # bit for bit the checkpoint's bytes
    we = model.tensor("embeddings.word_embeddings.weight")
    assert we.dtype == np.dtype(ml_dtypes.bfloat16) and we.shape == (30522, 384)
    # the linears are not among them
    assert not any(t.name.endswith((".qweight", ".scales")) for t in tensors)


def test_unknown_name_is_enoent(model):
    with pytest.raises(radiance.RadianceError) as ei:
        model.tensor("encoder.layer.0.attention.self.query.qweight")
    assert ei.value.errno == errno.ENOENT
    assert "no shared tensor" in ei.value.message and "Model.tensors" in ei.value.message


def test_views_are_read_only(model):
    a = model.tensor("embeddings.LayerNorm.weight")
    assert not a.flags.writeable
    before = a.copy()
    with pytest.raises(ValueError):
        a[0] = 1
    with pytest.raises(ValueError):
        a.setflags(write=True)
    c = np.array(a)           # a private copy is writable, and changes nothing shared
    c[0] = 7
    assert np.array_equal(model.tensor("embeddings.LayerNorm.weight").view(np.uint16),
                          before.view(np.uint16))


_CHILD = textwrap.dedent("""
    import json, os, sys
    import radiance
    c = radiance.Client(sys.argv[1], timeout=60)
    m = c.attach(sys.argv[2])
    a = m.tensor("embeddings.word_embeddings.weight")
    first = a[:4].view("uint16").tolist()
    print(json.dumps({"map": _where(a), "first": first}))
""")

_WHERE = textwrap.dedent("""
    def _where(a):
        import os, re
        addr = a.__array_interface__["data"][0]
        ino = None
        with open("/proc/self/maps") as f:
            for line in f:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                if lo <= addr < hi and "radiance-tensors" in line:
                    ino = int(line.split()[4])
        frame = 0
        try:
            with open("/proc/self/pagemap", "rb") as f:
                f.seek(addr // 4096 * 8)
                e = int.from_bytes(f.read(8), "little")
                if e >> 63:
                    frame = e & ((1 << 55) - 1)
        except OSError:
            pass
        return {"ino": ino, "frame": frame}
""")
exec(_WHERE)


def test_two_processes_share_the_pages(daemon, client, model):
    a = model.tensor("embeddings.word_embeddings.weight")
    mine = _where(a)
    assert mine["ino"] is not None, "the view is not in a radiance-tensors mapping"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    out = subprocess.run([sys.executable, "-c", _WHERE + _CHILD, daemon.socket, model.name],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    assert theirs["first"] == a[:4].view(np.uint16).tolist()
    assert theirs["map"]["ino"] == mine["ino"]      # one memfd for both
    if mine["frame"] and theirs["map"]["frame"]:
        assert theirs["map"]["frame"] == mine["frame"]   # and one physical page
    else:
        print("page frames hidden by /proc/self/pagemap here (needs CAP_SYS_ADMIN)")


def test_freed_with_the_model_while_a_view_keeps_its_bytes(own_daemon):
    with radiance.Client(own_daemon.socket, timeout=60) as c:
        m = c.load(CKPT)
        assert memfds_of(own_daemon.pid) == 1
        a = m.tensor("embeddings.position_embeddings.weight")
        want = a.view(np.uint16).copy()
        m.close()     # the last user: the model is unloaded
        deadline = time.monotonic() + 20   # a hang guard: the unload runs on the executor
        while (c.resident_models() or memfds_of(own_daemon.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.resident_models() == []
        assert memfds_of(own_daemon.pid) == 0
        assert np.array_equal(a.view(np.uint16), want)   # documented: the view keeps its pages
        with pytest.raises(radiance.RadianceError) as ei:
            m.tensor("embeddings.position_embeddings.weight")
        assert ei.value.errno == errno.EBADF    # a released model maps nothing new
