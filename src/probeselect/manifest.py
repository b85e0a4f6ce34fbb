"""Run manifests: what produced a result folder, so it can be reproduced and audited."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

_PACKAGES = (
    "probeselect",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "datasets",
    "peft",
    "pandas",
    "numpy",
    "pyarrow",
)


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that can change a result."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def cpu_info() -> dict[str, str | None]:
    """The processor a run's float arithmetic ran on: its model name and the vector instruction set torch's
    CPU kernels use. Two CPU types (AVX2 vs AVX-512, Intel vs AMD) can round differently, so a toy ladder
    built on each differs and the results that follow with it; same machine, same bytes."""
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    capability = None
    if "torch" in sys.modules:  # only where a run already imported it (a manifest must not pull torch in)
        try:
            capability = str(sys.modules["torch"].backends.cpu.get_cpu_capability())
        except (AttributeError, RuntimeError):
            pass
    return {"model": model or platform.processor() or None, "torch_cpu_capability": capability}


def git_state(path: Path | None = None) -> dict[str, Any]:
    """Git commit and dirty flag of the probeselect source tree (None outside a checkout)."""
    path = Path(path or Path(__file__).resolve().parent)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=path, capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return {"commit": commit, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def base_manifest(kind: str, config: dict[str, Any]) -> dict[str, Any]:
    """The fields every manifest has: kind, time, command line, versions, git, config."""
    return {
        "kind": kind,
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": sys.argv,
        "platform": platform.platform(),
        "cpu": cpu_info(),
        "versions": package_versions(),
        "git": git_state(),
        "config": config,
    }


def checkpoint_steps(manifest: dict | None) -> dict[str, float]:
    """``{checkpoint name: step}`` from a score run's ``manifest.json`` (checkpoints without a step are left out)."""
    out = {}
    for c in (manifest or {}).get("checkpoints") or []:
        if isinstance(c, dict) and c.get("name") is not None and c.get("step") is not None:
            out[str(c["name"])] = float(c["step"])
    return out
