"""Builds zccl_torch, the torch.distributed backend "zccl".

    pip install --no-build-isolation ./bindings/torch

libzccl is looked for in this order: $ZCCL_HOME (an install prefix: include/ and lib/), the repository's build
tree (../../build, or $ZCCL_BUILD_DIR), then pkg-config's zccl.pc. The extension gets an rpath to the library's
directory, so no LD_LIBRARY_PATH is needed.
"""
import os
import shutil
import subprocess

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))


def find_zccl():
    home = os.environ.get("ZCCL_HOME")
    if home:
        for lib in ("lib", "lib64", "lib/x86_64-linux-gnu"):
            if os.path.exists(os.path.join(home, lib, "libzccl.so")):
                return os.path.join(home, "include"), os.path.join(home, lib)
        raise SystemExit(f"ZCCL_HOME={home}: no lib/libzccl.so there")
    build = os.environ.get("ZCCL_BUILD_DIR", os.path.join(REPO, "build"))
    if os.path.exists(os.path.join(build, "libzccl.so")) and os.path.exists(os.path.join(REPO, "include", "zccl.h")):
        return os.path.join(REPO, "include"), os.path.abspath(build)
    if shutil.which("pkg-config"):
        try:
            inc = subprocess.check_output(["pkg-config", "--variable=includedir", "zccl"], text=True).strip()
            lib = subprocess.check_output(["pkg-config", "--variable=libdir", "zccl"], text=True).strip()
            return os.path.normpath(inc), os.path.normpath(lib)
        except subprocess.CalledProcessError:
            pass
    raise SystemExit("libzccl not found: set ZCCL_HOME to its install prefix, build the repository into "
                     f"{build} (cmake --build build --target zccl), or install zccl.pc for pkg-config")


inc, lib = find_zccl()
setup(
    name="zccl_torch",
    version="0.1.0",
    description="zccl backend for torch.distributed",
    packages=["zccl_torch"],
    ext_modules=[
        CppExtension(
            name="zccl_torch._C",
            sources=["csrc/module.cpp", "csrc/ProcessGroupZccl.cpp", "csrc/collectives.cpp", "csrc/p2p.cpp",
                     "csrc/quantized.cpp"],
            # headers: a change to one rebuilds the extension (build_ext compares sources and these with the .so)
            depends=[os.path.join("csrc", h) for h in ("ProcessGroupZccl.hpp", "tensors.hpp")] +
                    [os.path.join(inc, h) for h in ("zccl.h", "zccl_hier.h") if os.path.exists(os.path.join(inc, h))],
            include_dirs=[os.path.join(HERE, "csrc"), inc],
            library_dirs=[lib],
            libraries=["zccl"],
            extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"],
            extra_link_args=[f"-Wl,-rpath,{lib}"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
)
