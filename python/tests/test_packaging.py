"""`pip install ./python` installs a working package (libraries packaged from GREENMIM_LIB_DIR,
the build CI already made; the CMake path is the same build)."""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_pip_install_into_target(tmp_path):
    lib_dir = os.environ.get("GREENMIM_LIB_DIR", str(ROOT / "build/lib"))
    if not (pathlib.Path(lib_dir) / "libgreenmim_host.so").exists():
        pytest.skip("libgreenmim_host.so not built")
    env = {**os.environ, "GREENMIM_LIB_DIR": lib_dir}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q",
                        "--disable-pip-version-check", "--target", str(tmp_path / "site"), str(ROOT / "python")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    installed = tmp_path / "site" / "greenmim" / "_libs" / "libgreenmim_host.so"
    assert installed.exists()
    # the installed copy finds its own libraries (no GREENMIM_LIB_DIR, not the source tree)
    env2 = {k: v for k, v in os.environ.items() if k not in ("GREENMIM_LIB_DIR", "PYTHONPATH")}
    env2["PYTHONPATH"] = str(tmp_path / "site")
    code = ("import greenmim, greenmim._lib as L, torch; p = greenmim.plan_masks(greenmim.random_masks()); "
            "print(p.stages[0].num_tokens, L._libs['host']._name)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env2, timeout=300,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    n, path = r.stdout.split()
    assert n == "768" and path.startswith(str(tmp_path / "site"))
    # the installed copy has the pretraining command too (its subpackage is packaged)
    r = subprocess.run([sys.executable, "-m", "greenmim.pretrain", "--help"], capture_output=True, text=True,
                       env=env2, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0 and "--per_sample_masks" in r.stdout, r.stderr[-2000:]
    assert (tmp_path / "site" / "greenmim" / "pretrain" / "engine.py").exists()
