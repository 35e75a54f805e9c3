"""Evaluation output: ``metrics.json`` (lighteval-style, as Atropos wrote it) and samples."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import orjson

logger = logging.getLogger(__name__)


def write_eval_results(
    directory: str | Path,
    *,
    metrics: dict[str, Any],
    task_name: str,
    model_name: str,
    seconds: float,
    generation_parameters: dict[str, Any],
    samples: list[dict[str, Any]] | None,
) -> Path:
    """Write ``metrics.json`` and, when given, ``samples.jsonl``; returns the metrics path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    result = {
        "config_general": {
            "model_name": model_name,
            "total_evaluation_time_seconds": str(seconds),
            "generation_parameters": generation_parameters,
        },
        "results": {f"atropos|{task_name}|0": metrics, "all": metrics},
    }
    path = folder / "metrics.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    if samples:
        with (folder / "samples.jsonl").open("wb") as handle:
            for sample in samples:
                handle.write(orjson.dumps(sample, default=str) + b"\n")
    logger.info("evaluation results written to %s", folder)
    return path
