"""What a result was produced with: the package versions, this project's version and commit, the
device, the precision, the threads, the CPU and its instruction set, and the command line.

A run's ``environment.json``, ``python -m bertcf.evaluate --json`` and the experiments'
``suite.json`` carry ``collect()``'s record; ``--resume`` compares it with the run's
(``differences``). Versions come from the installed distributions (``importlib.metadata``), so
nothing is imported for them; torch is asked only what torch alone knows (its threads, its CPU
kernels, the GPU's name). Anything that cannot be found (git absent, the package installed outside
a checkout, a file system without /proc) is None, never an error.
"""
from __future__ import annotations

import importlib.metadata
import platform
import shlex
import subprocess
import sys
from pathlib import Path

#: The distributions whose versions a record names (as pip names them).
PACKAGES = ("torch", "transformers", "tokenizers", "sentence-transformers", "numpy", "scikit-learn")
PROJECT = "bertcf"
#: The checkout this module is in, when it is one (``bertcf/utils/environment.py`` -> the repository).
CHECKOUT = Path(__file__).resolve().parents[2]
#: Fields that differ between any two sessions of one run, so a resume does not compare them.
NOT_COMPARED = ("command", "started", "session")


def version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def package_versions() -> dict[str, str | None]:
    """{distribution: installed version or None} for PACKAGES."""
    return {name: version(name) for name in PACKAGES}


def project_version() -> str | None:
    """This project's version: the installed distribution's, else the ``pyproject.toml`` of the
    checkout it runs from (``PYTHONPATH=.``), else None."""
    found = version(PROJECT)
    if found is not None:
        return found
    try:
        import tomllib
        return tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["version"]
    except (ImportError, OSError, ValueError, KeyError):
        return None


def versions() -> dict:
    """Python's, this project's and PACKAGES' versions: the part of a record a model card names."""
    return {"python": platform.python_version(), "bertcf_version": project_version(), "packages": package_versions()}


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):  # no git, or it hangs
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_state(root: Path | None = None) -> tuple[str | None, bool | None]:
    """(commit, whether the tree has uncommitted changes) of the checkout at ``root`` (default:
    the one this package runs from); (None, None) without git or outside a checkout. A git
    repository that merely contains the package (a virtualenv inside another project) is not its
    checkout: its top level must be ``root`` itself."""
    root = Path(root or CHECKOUT)
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != root.resolve():
        return None, None
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain")  # tracked changes and new files; ignored ones (data/, runs/) not
    return commit, (None if commit is None or status is None else status != "")


def cpu_model() -> str | None:
    """The CPU's name: /proc/cpuinfo's "model name" (Linux x86), else platform's, else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or None


def device_name(device) -> str | None:
    """The GPU's name for a CUDA device, else the CPU's."""
    if device is not None and str(device).startswith("cuda"):
        import torch
        try:
            return torch.cuda.get_device_name(torch.device(device))
        except (RuntimeError, AssertionError, ValueError):
            return None
    return cpu_model()


def torch_facts() -> dict:
    """The torch threads, PyTorch's CPU kernels (DEFAULT, AVX2, AVX512, ...) and the processes of
    the torch.distributed group; None each where torch cannot say."""
    try:
        import torch
    except ImportError:
        return {"torch_threads": None, "cpu_capability": None, "world_size": None}
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    return {"torch_threads": torch.get_num_threads(), "cpu_capability": capability() if capability else None,
            "world_size": world}


def collect(device=None, precision: str | None = None) -> dict:
    """The record of this process: versions (``packages``: distribution -> version), the project's
    version, commit and whether its tree had uncommitted changes, ``device`` and its name, the
    ``precision``, torch's threads and CPU capability, the CPU model and the full command line
    (the process's, as Python was started)."""
    commit, dirty = git_state()
    return {**versions(), "git_commit": commit, "git_dirty": dirty,
            "device": None if device is None else str(device), "device_name": device_name(device),
            "precision": precision, **torch_facts(), "cpu_model": cpu_model(), "platform": platform.platform(),
            "command": shlex.join(getattr(sys, "orig_argv", sys.argv))}


def flatten(record: dict, prefix: str = "") -> dict:
    """{"packages": {"torch": v}} -> {"packages.torch": v}."""
    flat = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def differences(old: dict, new: dict) -> list[tuple[str, object, object]]:
    """(field, old value, new value) for each field of either record that differs, but those that
    differ between any two sessions (NOT_COMPARED)."""
    a, b = flatten(old), flatten(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k.split(".")[0] not in NOT_COMPARED and a.get(k) != b.get(k)]


def summary(record: dict) -> str:
    """The versions in one line: "Python 3.11.7, bertcf 0.1.0, torch 2.13.0, ..."."""
    packages = ", ".join(f"{name} {v}" for name, v in record.get("packages", {}).items() if v)
    return f"Python {record.get('python')}, bertcf {record.get('bertcf_version')}, {packages}"
