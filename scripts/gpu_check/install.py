"""Install the prepared wheels into a private folder, with no network (``pip --no-index``).

On the node's interpreter (the one ``prepare`` targeted) the folder goes first on the steps'
path. On another interpreter (CI's) the wheels are still installed, for the target's version
and platform, which checks that they install; the steps then run on this interpreter's own
packages.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_check.prepare import PLATFORMS


def install(wheels: Path, target: Path, prepared: Path) -> dict[str, Any]:
    manifest = json.loads((prepared / "manifest.json").read_text())
    wanted = manifest["python_version"]
    here = ".".join(platform.python_version_tuple()[:2])
    files = sorted(str(w) for w in wheels.glob("*.whl"))
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
            "--no-compile", "--no-cache-dir", "--disable-pip-version-check", "--upgrade",
            "--target", str(target)]  # fmt: skip
    if here != wanted:
        argv += ["--python-version", wanted, "--implementation", "cp", "--only-binary=:all:",
                 *(arg for p in PLATFORMS for arg in ("--platform", p))]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run([*argv, *files], capture_output=True, text=True)
    return {
        "wheels": len(files),
        "target": str(target),
        "for_python": wanted,
        "this_python": here,
        "ok": done.returncode == 0,
        "usable": done.returncode == 0 and here == wanted,
        "seconds": round(time.monotonic() - started, 1),
        "error": done.stderr.strip()[-500:] if done.returncode else None,
    }
