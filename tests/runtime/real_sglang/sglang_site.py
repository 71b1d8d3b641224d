"""A released sglang for the real-class tests: installed once into a cache outside the repository, never
into the environment, and put on ``sys.path`` only while those tests run.

sglang itself goes in with ``--no-deps`` (its wheel is cp311/manylinux; only its pure-Python modules are
imported, so the tags are pinned and any interpreter can use it). The packages its memory-pool,
allocator, forward-batch and server-args modules import come from ``requirements.txt`` beside this
file, also ``--no-deps``, plus the torchvision release that matches the installed torch.

Not loaded as released, each only where it cannot load: torchvision's native part on a CPU torch
(two op schemas are defined instead), and on a CUDA machine without them sglang's CUDA kernel
packages ``sgl_kernel`` and ``flashinfer`` (stand-ins whose names raise if called).

Environment: ``CANARY_INSTRUMENT_SGLANG_CACHE`` (default ``~/.cache/canary-instrument/sglang``) is the
cache; ``CANARY_INSTRUMENT_SGLANG_WHEELS`` names folders of wheels (``os.pathsep``-separated) to install
from with no index (machines without network, e.g. the GPU box: fill them with ``pip download``, see
docs/sglang-walkthrough.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SGLANG_VERSION = "0.5.20"
CACHE_ENV = "CANARY_INSTRUMENT_SGLANG_CACHE"
WHEELS_ENV = "CANARY_INSTRUMENT_SGLANG_WHEELS"
REQUIREMENTS = Path(__file__).with_name("requirements.txt")
# The tags of the released sglang wheels (cp311, manylinux_2_34): fixed so that a 3.12 interpreter
# can still unpack the pure-Python modules the tests import.
_SGLANG_TAGS = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
                "--platform", "manylinux_2_34_x86_64", "--only-binary", ":all:"]
# What pip prints when it cannot reach the package index (as opposed to a real install failure).
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution|"
    r"Name or service not known|Network is unreachable|ConnectTimeoutError|ReadTimeoutError|"
    r"Connection refused|Could not fetch URL|ProxyError"
)


class IndexUnreachable(RuntimeError):
    """pip could not reach the package index (the tests skip with this sentence)."""


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "canary-instrument" / "sglang")


def ensure_site(version: str = SGLANG_VERSION) -> list[Path]:
    """The sglang folder and its dependency folder, installed on first use (under a lock, atomically)."""
    import torch

    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    torch_tag = re.sub(r"[^A-Za-z0-9.]+", "_", torch.__version__)
    sglang_dir = root / f"sglang-{version}"
    # Keyed by the requirements' content too, so a changed list is installed afresh.
    pins = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:10]
    deps_dir = root / f"deps-{version}-{pins}-cp{sys.version_info.major}{sys.version_info.minor}-torch{torch_tag}"
    with _locked(root / ".lock"):
        if not sglang_dir.is_dir():
            _install(sglang_dir, [*_SGLANG_TAGS, f"sglang=={version}"])
        if not deps_dir.is_dir():
            extra = [] if importlib.util.find_spec("torchvision") else [_matching_torchvision(torch.__version__)]
            _install(deps_dir, ["-r", str(REQUIREMENTS), *extra])
    return [sglang_dir, deps_dir]


def _matching_torchvision(torch_version: str) -> str:
    """torchvision 0.(m + 15).p ships for torch 2.m.p (0.26 for 2.11, 0.28 for 2.13)."""
    major, minor, patch = (int(x) for x in re.findall(r"\d+", torch_version)[:3])
    if major != 2:
        raise RuntimeError(f"no torchvision release is known for torch {torch_version}")
    return f"torchvision==0.{minor + 15}.{patch}"


def _install(target: Path, args: list[str]) -> None:
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--quiet",
               "--no-warn-script-location", "--target", str(partial), *args]
    wheels = os.environ.get(WHEELS_ENV)
    if wheels:
        command.append("--no-index")
        for folder in wheels.split(os.pathsep):
            command += ["--find-links", folder]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        output = done.stdout + done.stderr
        if not wheels and _UNREACHABLE.search(output):
            raise IndexUnreachable(
                f"the package index is unreachable, so sglang {SGLANG_VERSION} cannot be installed for the "
                f"real-class tests (pip: {_UNREACHABLE.search(output).group(0)})"
            )
        raise RuntimeError(f"installing {' '.join(args)} into {target} failed:\n{output[-4000:]}")
    os.replace(partial, target)  # the folder appears complete or not at all


@contextlib.contextmanager
def _locked(path: Path):
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # pytest-xdist workers install once, one at a time
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def on_path(folders: list[Path]):
    """sglang and its dependencies first on ``sys.path``; the path and the environment are restored after."""
    saved_path, saved_env = list(sys.path), dict(os.environ)
    sys.path[:0] = [str(f) for f in folders]
    _define_torchvision_ops_if_native_part_missing()
    stand_ins = _CudaKernelStandIns.install()
    try:
        yield
    finally:
        if stand_ins is not None:
            sys.meta_path.remove(stand_ins)
        sys.path[:] = saved_path
        # sglang's import sets cache-directory variables (setdefault) for its JIT kernels.
        for key in set(os.environ) - set(saved_env):
            del os.environ[key]
        os.environ.update(saved_env)


_TORCHVISION_OPS = None


def _define_torchvision_ops_if_native_part_missing() -> None:
    """torchvision's native part (``_C.so``) from PyPI links the CUDA build of torch (libc10_cuda.so), so it
    cannot load against a CPU torch. Its Python part still imports, except that it registers fake kernels
    for two ops the native part would have defined (``torchvision::nms``, ``torchvision::qnms``). Define
    exactly those two op schemas (no kernels) when, and only when, the native part does not load."""
    global _TORCHVISION_OPS
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or _TORCHVISION_OPS is not None or not spec.submodule_search_locations:
        return
    native = next(Path(spec.submodule_search_locations[0]).glob("_C*.so"), None)
    try:
        if native is not None:
            torch.ops.load_library(str(native))
            return
    except OSError:
        pass
    if hasattr(torch.ops.torchvision, "nms"):
        return
    _TORCHVISION_OPS = torch.library.Library("torchvision", "DEF")
    _TORCHVISION_OPS.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _TORCHVISION_OPS.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _StandInMeta(type):
    """A stand-in name: reading its attributes (``scalar_types.uint4b8`` at module level) gives more
    stand-ins, subclassing it works, calling it raises."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stand_in(cls.__module__, f"{cls.__qualname__}.{attr}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"{cls.__module__}.{cls.__qualname__} is a test stand-in: {cls.__module__} (a CUDA "
                           "kernel package) is not installed, and the canary tests never call it")


def _stand_in(owner: str, name: str) -> type:
    return _StandInMeta(name.rsplit(".", 1)[-1], (), {"__module__": owner, "__qualname__": name})


class _CudaKernelStandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """On a CUDA machine, sglang's modules import its CUDA kernel packages at module level (``if _is_cuda:
    from sgl_kernel import int8_scaled_mm``, ``from sgl_kernel.kvcacheio import ...``, ``from flashinfer import
    ...``). They are CUDA builds of their own (sglang-kernel, flashinfer) that the tests never call. When, and
    only when, CUDA is visible and a package is not installed, its imports get a stand-in whose every name
    raises if called; on CPU sglang takes its CPU branches and no stand-in is made."""

    PACKAGES = ("sgl_kernel", "flashinfer")

    @classmethod
    def install(cls):
        import torch

        if not torch.cuda.is_available():
            return None
        missing = tuple(p for p in cls.PACKAGES if importlib.util.find_spec(p) is None)
        if not missing:
            return None
        finder = cls(missing)
        sys.meta_path.insert(0, finder)
        return finder

    def __init__(self, packages):
        self.packages = packages

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []

        def __getattr__(attr, _owner=module.__name__):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _stand_in(_owner, attr)

        module.__getattr__ = __getattr__
