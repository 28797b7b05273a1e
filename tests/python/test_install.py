"""`pip install ./python` gives a working package: built from the source tree
with the venv's setuptools (no network: --no-build-isolation, --no-deps),
into a private directory, then imported from there alone. The header the
cffi declarations come from must be in it as a file (it is a symlink to
client/radiance.h in the tree), and radiance_gpu.h (mapped mode) too."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import CKPT, REPO


def test_pip_install_builds_a_working_package(tmp_path, daemon):
    pytest.importorskip("setuptools", reason="setuptools (tests/requirements.txt) is not installed")
    # pip builds in the source directory (build/, *.egg-info): build a copy,
    # laid out as in the repository so the header symlink resolves
    src = tmp_path / "repo"
    shutil.copytree(REPO / "python", src / "python", symlinks=True)
    (src / "client").mkdir()
    for h in ("radiance.h", "radiance_gpu.h"):
        shutil.copy(REPO / "client" / h, src / "client" / h)
    assert (src / "python" / "radiance" / "radiance.h").is_symlink()
    target = tmp_path / "site"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--disable-pip-version-check",
                        "--target", str(target), str(src / "python")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    header = target / "radiance" / "radiance.h"
    assert header.is_file() and not header.is_symlink()
    assert header.read_bytes() == (REPO / "client" / "radiance.h").read_bytes()
    gpu_header = target / "radiance" / "radiance_gpu.h"
    assert gpu_header.is_file() and not gpu_header.is_symlink()
    assert gpu_header.read_bytes() == (REPO / "client" / "radiance_gpu.h").read_bytes()
    assert (target / "radiance" / "py.typed").is_file()
    code = ("import radiance, ml_dtypes, numpy as np, sys\n"
            "assert radiance.__file__.startswith(sys.argv[1]), radiance.__file__\n"
            "with radiance.Client(sys.argv[2]) as c:\n"
            "    m = c.load(sys.argv[3])\n"
            "    y = m.linear(0, np.ones((2, m.layers[0].K), ml_dtypes.bfloat16))\n"
            "    print(y.shape, radiance.__version__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    r = subprocess.run([sys.executable, "-c", code, str(target), daemon.socket, str(CKPT)],
                       env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["(2,", "384)", "0.1.0"]
