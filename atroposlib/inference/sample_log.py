"""Test mode: a JSONL record of every sequence the server sampled (``--sample-log``).

One line per finished sequence of a non-streamed request (``/generate``, and the OpenAI routes
without ``stream``): ``prompt_ids``, ``output_ids``, ``logprobs``, ``finish_reason``,
``weight_version`` and ``weight_versions`` (``[version, start, end]`` spans over the output
tokens). Tests compare what a client trains on with what
was really sampled; it is not meant for production traffic (it grows without bound).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

import orjson

from atroposlib.inference.batch import Sequence


class SampleLog:
    """Appends finished sequences to ``path``; does nothing when ``path`` is None."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def record(self, done: Iterable[Sequence]) -> None:
        if self.path is None:
            return
        lines = b"".join(
            orjson.dumps(
                {
                    "prompt_ids": seq.prompt_ids,
                    "output_ids": seq.output_ids,
                    "logprobs": seq.logprobs,
                    "finish_reason": seq.finish_reason,
                    "weight_version": seq.weight_version,
                    "weight_versions": seq.version_spans(),
                }
            )
            + b"\n"
            for seq in done
        )
        with self._lock, self.path.open("ab") as handle:
            handle.write(lines)


def read_sample_log(path: Path) -> list[dict[str, object]]:
    """Every record of a sample log, in order."""
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def trained_spans(masks: list[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of trained positions (mask != -100) of a written sequence:
    each should be an output the sample log holds right after ``tokens[:start]``.

    >>> trained_spans([-100, -100, 5, 6, -100, 7])
    [(2, 4), (5, 6)]
    """
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for index, mask in enumerate([*masks, -100]):
        if mask != -100 and start is None:
            start = index
        elif mask == -100 and start is not None:
            spans.append((start, index))
            start = None
    return spans
