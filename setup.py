"""Builds tf_amp, including its native op library, against the TensorFlow already installed.

The op must be compiled with the same headers and ABI flags as the TensorFlow that will load
it, so the build imports TensorFlow and asks ``tf.sysconfig``; that is why installation uses
``pip install --no-build-isolation`` (an isolated build environment has no TensorFlow).

* Always: the CPU kernel (``tf_amp/cc/*.cc``) -> ``tf_amp/_tf_amp_ops.so``.
* TensorFlow built with CUDA and ``nvcc`` found: the CUDA kernel is compiled and linked in and
  registered for DEVICE_GPU.
* CPU TensorFlow but ``nvcc`` found: the CUDA source is still compiled (not linked), so a
  broken kernel is caught on machines without a GPU. ``TF_AMP_SKIP_CUDA_CHECK=1`` skips it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import setuptools
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
CC_DIR = os.path.join("tf_amp", "cc")
CPU_SOURCES = [
    os.path.join(CC_DIR, "unscale_and_check_finite_op.cc"),
    os.path.join(CC_DIR, "unscale_kernels_cpu.cc"),
]
GPU_GLUE_SOURCE = os.path.join(CC_DIR, "unscale_and_check_finite_op_gpu.cc")
CUDA_SOURCE = os.path.join(CC_DIR, "unscale_and_check_finite_gpu.cu.cc")
# The startup hook: a one-line .pth that imports tf_amp only when TF_ENABLE_AUTO_MIXED_PRECISION*
# is set. A .pth only runs from the site-packages root, so it is copied there, beside tf_amp/.
STARTUP_HOOK = os.path.join("tf_amp", "runtime", "tf_amp_autoenable.pth")
CUDA_ARCHS = ("75", "80", "90")  # CUDA 13 dropped Volta (sm_70)


class BuildError(RuntimeError):
    """A build prerequisite is missing; the message says what to install."""


def _tensorflow_flags() -> tuple[list[str], list[str], bool]:
    try:
        import tensorflow as tf
    except ImportError as error:
        raise BuildError(
            "tf_amp builds its native op against the installed TensorFlow, and none was found "
            f"({error}). Install it first: `pip install 'tensorflow-cpu==2.21.*'` (CPU) or "
            "`pip install 'tensorflow[and-cuda]==2.21.*'` (GPU), then "
            "`pip install --no-build-isolation -e .`"
        ) from error
    return (
        tf.sysconfig.get_compile_flags(),
        tf.sysconfig.get_link_flags(),
        bool(tf.test.is_built_with_cuda()),
    )


def _find_compiler() -> str:
    compiler = os.environ.get("CXX", "g++")
    path = shutil.which(compiler)
    if path is None:
        raise BuildError(
            f"no C++ compiler ({compiler!r}) found to build tf_amp's native op: install one "
            "(Debian/Ubuntu: `apt-get install g++`) or set CXX"
        )
    return path


def _run(command: list[str]) -> None:
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=HERE)


def _nvcc_command(nvcc: str, output: str, link_ready: bool) -> list[str]:
    gencode = []
    for arch in CUDA_ARCHS:
        gencode += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    flags = ["-Xcompiler", "-fPIC"] if link_ready else []
    return [nvcc, "-std=c++17", "-O3", "-I.", "-x", "cu", "-c", CUDA_SOURCE, "-o", output,
            *gencode, *flags]


class BuildPyWithStartupHook(build_py):
    """Also places the startup-hook .pth at the root of the wheel (site-packages)."""

    def run(self) -> None:
        super().run()
        self.copy_file(os.path.join(HERE, STARTUP_HOOK),
                       os.path.join(self.build_lib, os.path.basename(STARTUP_HOOK)))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        hook = os.path.join(self.build_lib, os.path.basename(STARTUP_HOOK))
        return [*super().get_outputs(include_bytecode), hook]



class _StrategyWithStartupHook:
    """Wraps setuptools' editable-install strategy to add the startup hook to the wheel.

    An editable wheel holds only setuptools' own finder and .pth, so the hook that a normal
    wheel gets from build_py is written here, at the wheel's root (site-packages).
    """

    def __init__(self, inner):
        self.inner = inner

    def __enter__(self):
        self.inner.__enter__()
        return self

    def __exit__(self, *exc_info):
        return self.inner.__exit__(*exc_info)

    def __call__(self, wheel, files, mapping):
        self.inner(wheel, files, mapping)
        with open(os.path.join(HERE, STARTUP_HOOK), encoding="utf-8") as hook:
            wheel.writestr(os.path.basename(STARTUP_HOOK), hook.read())


def _command_classes() -> dict[str, type]:
    commands: dict[str, type] = {"build_ext": BuildTfAmpOps, "build_py": BuildPyWithStartupHook}
    try:
        from setuptools.command.editable_wheel import editable_wheel
    except ImportError:  # setuptools < 64: no PEP 660 editable installs
        return commands

    class EditableWheelWithStartupHook(editable_wheel):
        def _select_strategy(self, *args, **kwargs):
            return _StrategyWithStartupHook(super()._select_strategy(*args, **kwargs))

    commands["editable_wheel"] = EditableWheelWithStartupHook
    return commands


class BuildTfAmpOps(build_ext):
    """Compiles the op library with TensorFlow's own flags instead of Python's."""

    def get_ext_filename(self, fullname: str) -> str:
        # A fixed name: tf.load_op_library takes a path, and this is no Python extension module.
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext: Extension) -> None:
        compile_flags, link_flags, tf_has_cuda = _tensorflow_flags()
        compiler = _find_compiler()
        output = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(output), exist_ok=True)
        common = ["-O3", "-fPIC", "-Wno-deprecated-declarations", "-I."]
        nvcc = shutil.which("nvcc") or shutil.which("/usr/local/cuda/bin/nvcc")

        with tempfile.TemporaryDirectory() as scratch:
            sources = list(CPU_SOURCES)
            extra_objects: list[str] = []
            cuda_flags: list[str] = []
            if tf_has_cuda and nvcc:
                cuda_object = os.path.join(scratch, "unscale_gpu.o")
                _run(_nvcc_command(nvcc, cuda_object, link_ready=True))
                cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
                sources.append(GPU_GLUE_SOURCE)
                extra_objects.append(cuda_object)
                cuda_flags = ["-DGOOGLE_CUDA=1", f"-I{cuda_home}/include",
                              f"-L{cuda_home}/lib64", "-lcudart"]
            elif nvcc and os.environ.get("TF_AMP_SKIP_CUDA_CHECK", "") in ("", "0"):
                # CPU TensorFlow: nothing could load a GPU kernel, but the source must compile.
                _run(_nvcc_command(nvcc, os.path.join(scratch, "check.o"), link_ready=False))
            _run([compiler, "-shared", *common, *sources, *extra_objects, *compile_flags,
                  *cuda_flags, *link_flags, "-o", output])
        print(f"tf_amp: built {output} (CUDA kernel linked: {bool(extra_objects)})")


def _license_metadata() -> dict[str, str]:
    """The licence in the form the running setuptools reads (pyproject lists it as dynamic).

    ``pip install --no-build-isolation`` builds with the environment's setuptools, not the one
    ``[build-system]`` asks for. setuptools >= 77 takes an SPDX expression (written to the
    ``License-Expression`` field) and deprecates the older forms; older ones reject the SPDX
    string in pyproject.toml but take the plain ``license`` keyword here.
    """
    major = int(setuptools.__version__.split(".")[0])
    if major >= 77:
        return {"license_expression": "Apache-2.0"}
    return {"license": "Apache-2.0"}


try:
    setup(
        ext_modules=[Extension("tf_amp._tf_amp_ops", sources=CPU_SOURCES)],
        cmdclass=_command_classes(),
        **_license_metadata(),
    )
except BuildError as error:
    sys.exit(f"error: {error}")
