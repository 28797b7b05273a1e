"""Mapped mode from Python, the parts that need no GPU: where the package
looks for libradiance-gpu (radiance._gpu) and what it says when it is not
there, and Model.map()'s own argument checks. The mapped calls themselves
are tests/python/test_torch_cuda.py (GPU hosts)."""
import errno
import os
import subprocess
import sys

import pytest

import radiance
from conftest import REPO

LOAD = ("import radiance, radiance._gpu as g\ntry:\n    print('loaded', g.library_path())\n"
        "except radiance.RadianceError as e:\n    print(e.code, e.message)\n")


def run_load(**env):
    e = {k: v for k, v in os.environ.items() if k != "RADIANCE_GPU_LIBRARY"}
    e.update(env, PYTHONPATH=os.pathsep.join([str(REPO / "python")] +
             ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    out = subprocess.run([sys.executable, "-c", LOAD], env=e, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_wrong_gpu_library_path_is_an_error(tmp_path):
    out = run_load(RADIANCE_GPU_LIBRARY=str(tmp_path / "libnothere.so.0"))
    assert out.startswith("ENOENT cannot load $RADIANCE_GPU_LIBRARY="), out
    assert "libnothere.so.0" in out


def test_gpu_library_is_looked_for_beside_libradiance(tmp_path):
    """RADIANCE_LIBRARY=DIR/libradiance.so.0: DIR/libradiance-gpu.so.0 is
    tried first, then the package's directory and the system loader, and
    the error names each with what it found."""
    lib = tmp_path / "libradiance.so.0"
    lib.symlink_to(os.environ["RADIANCE_LIBRARY"])
    out = run_load(RADIANCE_LIBRARY=str(lib))
    if out.startswith("loaded"):
        pytest.skip(f"a libradiance-gpu is installed here ({out})")
    assert out.startswith("ENOENT cannot find libradiance-gpu: tried $RADIANCE_GPU_LIBRARY "
                          "(not set); "), out
    assert f"{tmp_path}/libradiance-gpu.so.0 (no such file)" in out
    assert "python/radiance/libradiance-gpu.so.0" in out and "the system loader" in out
    assert "make GPU=cuda" in out
    # a file there that is no library: its loader error is named
    (tmp_path / "libradiance-gpu.so.0").write_bytes(b"not an ELF file")
    out = run_load(RADIANCE_LIBRARY=str(lib))
    assert f"{tmp_path}/libradiance-gpu.so.0: " in out and "(no such file)" not in \
        out.split(";")[1], out


def test_map_checks_max_rows(model):
    for bad in (0, -1, 1 << 32, 2.0, True, "8"):
        with pytest.raises(radiance.RadianceError) as ei:
            model.map(max_rows=bad)
        assert ei.value.errno == errno.EINVAL and "max_rows" in ei.value.message


def test_map_checks_prefill(model):
    for bad in ("wgmma", "", None, 2, "FAST"):
        with pytest.raises(radiance.RadianceError) as ei:
            model.map(prefill=bad)
        assert ei.value.errno == errno.EINVAL, ei.value
        assert ei.value.message == f"prefill must be one of auto, exact, fast, not {bad!r}"


def test_map_names_the_missing_library(model):
    """On a CPU build (no libradiance-gpu beside libradiance) Model.map()
    says what to build; the session is unaffected."""
    lib_dir = os.path.dirname(os.environ["RADIANCE_LIBRARY"])
    if os.path.exists(os.path.join(lib_dir, "libradiance-gpu.so.0")) or \
            os.environ.get("RADIANCE_GPU_LIBRARY"):
        pytest.skip("libradiance-gpu is built here: test_torch_cuda.py covers mapping")
    with pytest.raises(radiance.RadianceError) as ei:
        model.map()
    assert ei.value.errno == errno.ENOENT and "make GPU=cuda" in ei.value.message
    import ml_dtypes
    import numpy as np
    assert model.linear(0, np.zeros((1, 384), ml_dtypes.bfloat16)).shape == (1, 384)
