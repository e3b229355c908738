"""Where and with what a run (or a sweep launch) was made: the machine, the package versions and the commit."""
from __future__ import annotations

import os
import platform
import subprocess
from contextlib import suppress
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "pytorch-lightning", "torch-geometric", "torchaudio", "torchmetrics", "omegaconf", "open3d")


def hardware() -> dict:
    """The machine: platform, CPU model and count, torch's threads, any GPUs."""
    import torch  # here: reading a launch log (``quest aggregate``) needs none of this

    info = {"platform": platform.platform(), "cpu": _cpu_model(), "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())


def versions() -> dict:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        with suppress(PackageNotFoundError):
            found[package] = version(package)
    return found


def git_commit() -> str | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None
