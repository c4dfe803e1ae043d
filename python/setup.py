"""Builds greenmim's shared libraries with CMake and ships them inside the package.

The package calls them through ctypes (greenmim/_lib.py) and compiles nothing against torch.
Environment: GREENMIM_LIB_DIR=<dir> packages already-built libraries instead of building;
GREENMIM_CUDA=OFF|ON|AUTO (default AUTO) chooses whether the CUDA kernels are built; the kernels on
the CPU emulator (libgreenmim_emu.so, greenmim.emulate_cuda()) are built whenever the CUDA headers
are found, with or without nvcc;
CMAKE_BUILD_PARALLEL_LEVEL as usual.
"""
import os
import pathlib
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
LIBS = ("libgreenmim_host.so", "libgreenmim_cuda.so", "libgreenmim_emu.so")


def _build_libs() -> pathlib.Path:
    prebuilt = os.environ.get("GREENMIM_LIB_DIR")
    if prebuilt:
        return pathlib.Path(prebuilt)
    if not (ROOT / "CMakeLists.txt").exists():
        raise RuntimeError("greenmim: build from the repository (pip install ./python), or set GREENMIM_LIB_DIR")
    bdir = pathlib.Path(tempfile.mkdtemp(prefix="greenmim-build-"))
    cuda = os.environ.get("GREENMIM_CUDA", "AUTO")
    off = ["TESTS", "TOOLS", "BENCH", "EXAMPLES"]
    subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(bdir), "-DCMAKE_BUILD_TYPE=Release",
                           f"-DGREENMIM_CUDA={cuda}", "-DGREENMIM_INSTALL=OFF", "-DGREENMIM_BUILD_PYTHON=ON"]
                          + [f"-DGREENMIM_BUILD_{o}=OFF" for o in off])
    subprocess.check_call(["cmake", "--build", str(bdir), "--target", "greenmim_python_libs"])
    return bdir / "lib"


class BuildWithLibs(build_py):
    def run(self):
        super().run()
        src = _build_libs()
        dst = pathlib.Path(self.build_lib) / "greenmim" / "_libs"
        dst.mkdir(parents=True, exist_ok=True)
        found = [n for n in LIBS if (src / n).exists()]
        if "libgreenmim_host.so" not in found:
            raise RuntimeError(f"greenmim: libgreenmim_host.so not found in {src}")
        for n in found:
            shutil.copy2(src / n, dst / n)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildWithLibs}, distclass=BinaryDistribution)
