"""Debian's packages for tests that need a real server binary: installed with apt-get when missing.

The tests never skip: a missing binary is installed (through ``sudo`` when not root), and a failure says exactly
what to run by hand. ``make test`` runs pytest in two worker processes (pytest-xdist), so two tests may want the
same package at once: installs take a file lock, and whoever gets it second finds the binary already there.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "mcp-lossless-apt.lock"


def installed_binary(name: str, package: str) -> str:
    """The path of ``name``, installing ``package`` first when it is not there."""
    search = f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/bin"
    found = shutil.which(name, path=search)
    if found:
        return found
    with LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return shutil.which(name, path=search) or _install(name, package, search)


def _install(name: str, package: str, search: str) -> str:
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"{name} is not installed and apt-get is not available: install {package} by hand")
    command = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "--no-install-recommends", package]
    install = _as_root(command)
    if install.returncode != 0:
        update = _as_root(["apt-get", "update"])
        install = _as_root(command)
        if install.returncode != 0:
            raise RuntimeError(
                f"could not install {package} (apt-get update: rc {update.returncode}; install: rc "
                f"{install.returncode}):\n{update.stderr[-2000:]}\n{install.stderr[-2000:]}"
            )
    found = shutil.which(name, path=search)
    if not found:
        raise RuntimeError(f"apt-get installed {package} but {name} is not on PATH")
    return found


def _as_root(command: list[str]) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0:
        sudo = shutil.which("sudo")
        if sudo is None:
            raise RuntimeError(f"a package is missing and so is sudo: install it as root: {' '.join(command)}")
        command = [sudo, "-n", *command]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        check=False,
        timeout=600,
    )
