"""Incremental gzip inflation: exact output whatever the chunking, caps, truncation, trailers."""

from __future__ import annotations

import gzip
import os

import pytest

from atroposlib.api.http import Inflater
from atroposlib.errors import RequestBodyError


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20, 1 << 24])
def test_inflates_exactly_whatever_the_chunking(chunk: int) -> None:
    payload = os.urandom(1 << 16) + bytes(3 << 20) + os.urandom(1000)
    body = gzip.compress(payload, compresslevel=6)
    inflater = Inflater(limit=len(payload))
    for start in range(0, len(body), chunk):
        inflater.feed(body[start : start + chunk])
    assert inflater.finish() == payload


def test_cap_truncation_and_trailing_data() -> None:
    body = gzip.compress(bytes(5 << 20))
    capped = Inflater(limit=(5 << 20) - 1)
    with pytest.raises(RequestBodyError) as err:
        capped.feed(body)
    assert err.value.status_code == 413
    truncated = Inflater(limit=10 << 20)
    truncated.feed(body[:-8])
    with pytest.raises(RequestBodyError, match="truncated"):
        truncated.finish()
    trailing = Inflater(limit=10 << 20)
    with pytest.raises(RequestBodyError, match="trailing"):
        trailing.feed(body + b"junk")
