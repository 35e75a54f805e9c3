"""Stored groups: compact bytes that decode to exactly what was validated."""

from __future__ import annotations

import numpy as np
import pytest

from atroposlib import codec
from atroposlib.api.store.blob import decode_group, encode_group
from atroposlib.api.validation import check_group


@pytest.mark.parametrize(
    ("tokens", "masks"),
    [
        ([[5, 65535, 0]], [[-100, 65535, 0]]),  # fits 16 bits, usual masks
        ([[5, 65536, 7]], [[-100, 65536, 7]]),  # one id past 16 bits: int32
        ([[-3, 4]], [[-100, 4]]),  # negative ids are odd but legal: int32
        ([[1, 2], []], [[1, -100], []]),
        ([[9, 9]], [[0, 9]]),  # masks that do not follow the rule are kept as they are
    ],
)
def test_round_trip_keeps_values_and_int32_rows(
    tokens: list[list[int]], masks: list[list[int]]
) -> None:
    group = {"tokens": tokens, "masks": masks, "scores": [1.0] * len(tokens), "env_id": 3}
    checked = check_group(group).group
    decoded = decode_group(encode_group(checked))
    assert [row.dtype for row in decoded["tokens"]] == [np.dtype("<i4")] * len(tokens)
    assert [row.tolist() for row in decoded["tokens"]] == tokens
    assert [row.tolist() for row in decoded["masks"]] == masks
    assert decoded["scores"] == group["scores"] and decoded["env_id"] == 3


def test_small_vocabularies_cost_three_bytes_per_token() -> None:
    rng = np.random.default_rng(0)
    tokens = [rng.integers(0, 50_000, 512).tolist() for _ in range(8)]
    masks = [[-100] * 128 + row[128:] for row in tokens]
    small = encode_group(check_group({"tokens": tokens, "masks": masks, "scores": [0.0] * 8}).group)
    big_tokens = [[t + 100_000 for t in row] for row in tokens]
    big_masks = [[-100] * 128 + row[128:] for row in big_tokens]
    big = encode_group(
        check_group({"tokens": big_tokens, "masks": big_masks, "scores": [0.0] * 8}).group
    )
    assert len(small) < 3.2 * 8 * 512 < 5 * 8 * 512 < len(big) < 5.2 * 8 * 512


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"inference_logprobs": [[-0.5, -1.0, -2.0], [-0.1, -0.2]], "ref_logprobs": None},
        {"advantages": [[1.0, 1.0, 1.0], [0.5, 0.5]]},
    ],
)
@pytest.mark.parametrize(
    ("tokens", "masks"),
    [
        ([[5, 65535, 0], [1, 2]], [[-100, 65535, 0], [1, -100]]),
        ([[-3, 4, 9], [70000, 1]], [[0, 4, 9], [-100, 1]]),
    ],
)
def test_packed_decoding_is_what_pack_group_makes_of_the_arrays(
    tokens: list[list[int]], masks: list[list[int]], extra: dict[str, object]
) -> None:
    group = {"tokens": tokens, "masks": masks, "scores": [1.0, 0.0], "env_id": 1, **extra}
    blob = encode_group(check_group(group).group)
    assert decode_group(blob, packed=True) == codec.pack_group(decode_group(blob))


def test_declared_sequence_fields_and_token_versions_round_trip() -> None:
    group = {
        "tokens": [[1, 2, 3], [1, 4]],
        "masks": [[-100, 2, 3], [-100, 4]],
        "scores": [1.0, 0.0],
        "inference_logprobs": [[1.0, -0.5, -0.25], [1.0, -2.0]],
        "token_policy_versions": [[-1, 7, 8], [-1, 7]],
        "finish_reasons": ["stop", "length"],
        "policy_versions": [7, 7],
        "extra": [{"status": "ok"}, {"status": "timeout"}],
        "overrides": [{"role": "X"}, {"role": "O", "truncated": True}],
    }
    blob = encode_group(check_group(group).group)
    decoded = decode_group(blob)
    assert [row.tolist() for row in decoded["token_policy_versions"]] == [[-1, 7, 8], [-1, 7]]
    for key in ("finish_reasons", "policy_versions", "extra", "overrides", "scores"):
        assert decoded[key] == group[key], key
    packed = decode_group(blob, packed=True)
    unpacked = codec.unpack_group(packed)
    assert [row.tolist() for row in unpacked["token_policy_versions"]] == [[-1, 7, 8], [-1, 7]]
