"""Files ``process`` and ``evaluate`` write, in Atropos 0.4's format where users read them.

- JSONL lines as the ``jsonlines`` package wrote them (``", "`` / ``": "`` separators,
  non-ASCII kept);
- a group row with Atropos's keys in its order; for an env that rolls out one sequence at a
  time (the default ``collect_trajectories``), the empty values Atropos's aggregation left:
  ``[]`` for ``advantages``, ``ref_logprobs``, ``messages``, ``overrides``, ``images`` and
  ``{}`` for ``group_overrides``;
- ``evaluate_config.yaml``: the run's settings under ``env:`` and ``openai:`` plus ``slurm``
  and ``testing``, readable back with ``--config`` (API keys are not written).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

__all__ = ["atropos_row", "jsonl_line", "write_evaluate_config"]

_ORDER = ("tokens", "masks", "scores", "advantages", "ref_logprobs", "messages",
          "group_overrides", "overrides", "images")  # fmt: skip
_LAST = ("distill_token_ids", "distill_logprobs")
_AGGREGATED_EMPTY: dict[str, Any] = {
    "advantages": [], "ref_logprobs": [], "messages": [], "group_overrides": {},
    "overrides": [], "images": [],
}  # fmt: skip


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    return str(value)


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "), default=_plain)


def jsonl_line(record: Any) -> bytes:
    """One JSONL line as Atropos's ``jsonlines`` writer wrote it.

    >>> jsonl_line({"a": [1, 2], "é": None})
    b'{"a": [1, 2], "\\xc3\\xa9": null}\\n'
    """
    return (_ENCODER.encode(record) + "\n").encode()


def atropos_row(group: dict[str, Any], *, aggregated: bool) -> dict[str, Any]:
    """``group`` as Atropos 0.4 wrote it to JSONL; ``aggregated``: it was stacked from single
    rollouts by the default ``collect_trajectories``.

    >>> list(atropos_row({"scores": [1.0], "masks": [[1]], "tokens": [[1]],
    ...                   "distill_logprobs": None, "env_id": 3}, aggregated=True).items())[3:]
    [('advantages', []), ('ref_logprobs', []), ('messages', []), ('group_overrides', {}), \
('overrides', []), ('images', []), ('env_id', 3), ('distill_logprobs', None)]
    """
    row = dict(group)
    if aggregated:
        for key, empty in _AGGREGATED_EMPTY.items():
            if row.get(key) is None:
                row[key] = type(empty)()
    first = {key: row.pop(key) for key in _ORDER if key in row}
    last = {key: row.pop(key) for key in _LAST if key in row}
    return {**first, **row, **last}


def _server_settings(servers: Any) -> Any:
    if isinstance(servers, list):
        return [_server_settings(server) for server in servers]
    if type(servers).__name__ == "ServerBaseline" or not isinstance(servers, BaseModel):
        return {}
    settings = servers.model_dump(mode="json")
    if "api_key" in settings:
        settings["api_key"] = None
    return settings


def write_evaluate_config(
    folder: str | Path, env_config: BaseModel, servers: Any, *, slurm: bool, testing: bool
) -> Path:
    """``<folder>/evaluate_config.yaml``, Atropos's record of an ``evaluate`` run."""
    record = {"env": env_config.model_dump(mode="json"), "openai": _server_settings(servers),
              "slurm": slurm, "testing": testing}  # fmt: skip
    path = Path(folder) / "evaluate_config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(record, default_flow_style=False, sort_keys=False))
    return path
