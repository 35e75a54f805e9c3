"""VLLMServer samples through vLLM's ``/inference/v1/generate`` (issue 62): token ids in and
out, each output token's weight version from the engine's spans; against a vLLM without the
route (no ``--enable-scale-out``) it falls back to ``/v1/completions`` and says its versions
are unknown. A fake vLLM on a real uvicorn port (tests/envs/fake_openai.py); the real vLLM's
spans across a push: tests/trainer/test_weight_sync_vllm_real.py."""

from __future__ import annotations

import logging

import httpx
import pytest
from envs_testlib import Process, tokenizer_path

from atroposlib.envs.rollouts import sample_group
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.envs.server_handling.vllm_server import VLLMServer
from atroposlib.errors import InferenceRejectedError


def vllm(fake: Process) -> VLLMServer:
    return VLLMServer(APIServerConfig(base_url=f"{fake.url}/v1", server_type="vllm",
                                      model_name="m"))  # fmt: skip


def control(fake: Process, **settings: object) -> dict[str, object]:
    return httpx.post(f"{fake.url}/control", json=settings).json()  # type: ignore[no-any-return]


async def test_token_ids_logprobs_and_each_tokens_version_come_from_the_token_route(
    fake: Process,
) -> None:
    control(fake, tokens_route=True, late_version=4)
    server = vllm(fake)
    try:
        sampling = {"max_new_tokens": 3, "temperature": 0.7, "stop": ["\n"], "split": "train"}
        sampled = await server.generate([1, 2, 3], 2, sampling)
    finally:
        await server.close()
    assert [s.output_ids for s in sampled] == [[300, 301, 2], [301, 301, 2]]
    assert sampled[0].logprobs == [-0.25, -0.5, -0.75]
    assert [s.token_versions for s in sampled] == [[0, 0, 4], [0, 0, 4]]
    assert sampled[0].weight_version == 0 and server.versions_unknown is None
    body = control(fake)["last_body"]
    assert body["token_ids"] == [1, 2, 3]  # type: ignore[index]
    assert body["sampling_params"] == {"max_tokens": 3, "temperature": 0.7, "stop": ["\n"],  # type: ignore[index]
                                       "n": 2, "logprobs": 0}  # fmt: skip


@pytest.mark.parametrize("closed", [False, "absent"])  # vLLM 0.32's 403, an older vLLM's 404
async def test_without_the_route_it_samples_through_completions_and_says_versions_are_unknown(
    fake: Process, caplog: pytest.LogCaptureFixture, closed: object
) -> None:
    control(fake, tokens_route=closed)
    server = vllm(fake)
    try:
        with caplog.at_level(logging.WARNING):
            first = await server.generate([1, 2, 3], 2, {"max_tokens": 3})
            second = await server.generate([1, 2], 1, {"max_tokens": 3})
    finally:
        await server.close()
    assert [s.output_ids for s in first] == [[300, 301, 2], [301, 301, 2]]
    assert all(s.token_versions is None and s.weight_version is None for s in first + second)
    assert server.versions_unknown is not None and "--enable-scale-out" in server.versions_unknown
    assert sum("--enable-scale-out" in r.getMessage() for r in caplog.records) == 1  # said once
    assert control(fake)["last_body"]["prompt"] == [1, 2]  # type: ignore[index]


async def test_a_sampling_field_vllm_would_ignore_is_refused_by_name(fake: Process) -> None:
    control(fake, tokens_route=True)
    server = vllm(fake)
    try:
        with pytest.raises(InferenceRejectedError, match="max_new_token"):
            await server.generate([1, 2, 3], 1, {"max_tokens": 3, "max_new_token": 5})
    finally:
        await server.close()
    assert control(fake)["requests"] == 0  # nothing sent


async def test_another_404_is_an_error_not_a_missing_route(fake: Process) -> None:
    control(fake, tokens_route=True, mode="reject")
    server = vllm(fake)
    try:
        with pytest.raises(InferenceRejectedError, match="404"):
            await server.generate([1, 2, 3], 1, {"max_tokens": 3})
    finally:
        await server.close()
    assert server.versions_unknown is None


@pytest.mark.parametrize("route", [True, False])
async def test_the_group_carries_each_tokens_version_or_says_why_it_has_none(
    fake: Process, route: bool
) -> None:
    from transformers import AutoTokenizer

    control(fake, tokens_route=route, late_version=2)
    servers = ServerManager([APIServerConfig(base_url=f"{fake.url}/v1", server_type="vllm",
                                             model_name="m")])  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path())
    try:
        group = await sample_group(servers, tokenizer, [{"role": "user", "content": "hi"}],
                                   lambda replies: [1.0, 0.0], n=2, max_tokens=3)  # fmt: skip
    finally:
        await servers.close()
    if route:
        assert group.token_policy_versions is not None
        assert [v[-3:] for v in group.token_policy_versions] == [[0, 0, 2]] * 2
        assert group.policy_versions == [0, 0] and group.extra is None
    else:
        assert group.token_policy_versions is None and group.policy_versions is None
        assert group.extra is not None and len(group.extra) == 2
        assert all("--enable-scale-out" in entry["versions_unknown"] for entry in group.extra)


async def test_a_label_that_names_no_step_leaves_the_versions_unknown_and_says_which(
    fake: Process,
) -> None:
    control(fake, tokens_route=True, late_version="base")  # someone labelled vLLM by hand
    server = vllm(fake)
    try:
        [sampled] = await server.generate([1, 2, 3], 1, {"max_tokens": 3})
    finally:
        await server.close()
    assert sampled.output_ids == [300, 301, 2] and sampled.logprobs == [-0.25, -0.5, -0.75]
    assert sampled.token_versions is None and sampled.weight_version is None
    assert sampled.versions_unknown is not None and "'base'" in sampled.versions_unknown
