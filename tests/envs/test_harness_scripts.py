"""ServerHarness: canned answers for ``--testing``, scripted answers for tests."""

from __future__ import annotations

import pytest

from atroposlib.envs.server_handling.server_harness import (
    ServerHarness,
    create_chat_completion,
    create_completion,
)
from atroposlib.envs.server_handling.server_manager import ServerManager
from tests.fakes import ChatCharTokenizer

HELLO = [{"role": "user", "content": "hello"}]


async def test_with_nothing_scripted_every_request_gets_a_canned_answer() -> None:
    harness = ServerHarness()
    chat = await harness.chat_completion(messages=HELLO, n=2)
    assert [c.message.content for c in chat.choices] == ["test response 0", "test response 1"]
    text = await harness.completion(prompt="x")
    assert text.choices[0].text == "test response 0"
    prompt, outputs, logprobs, reasons = await harness.tokens_and_logprobs_completion(
        input_ids=[5, 6], n=2, max_tokens=3
    )
    assert prompt == [5, 6] and outputs == [[1, 2, 3], [2, 3, 4]]
    assert logprobs == [[-1.0] * 3] * 2 and reasons == ["stop", "stop"]


async def test_scripted_chat_and_completion_answers_are_returned_as_copies() -> None:
    harness = ServerHarness()
    harness.set_desired_response(HELLO, create_chat_completion(["a", "b"], n=2))
    harness.set_desired_completion("2+2=", create_completion("4", finish_reason="length"))
    first = await harness.chat_completion(messages=HELLO)
    first.choices.clear()
    again = await harness.chat_completion(messages=[dict(m) for m in HELLO])
    assert [c.message.content for c in again.choices] == ["a", "b"]
    text = await harness.completion(prompt="2+2=")
    assert text.choices[0].text == "4" and text.choices[0].finish_reason == "length"


async def test_an_unscripted_request_of_a_scripted_kind_names_its_key() -> None:
    harness = ServerHarness()
    harness.set_desired_completion("known", create_completion("x"))
    with pytest.raises(KeyError, match="'unknown'"):
        await harness.completion(prompt="unknown")
    # chats are another kind: still canned
    chat = await harness.chat_completion(messages=HELLO)
    assert chat.choices[0].message.content == "test response 0"


async def test_a_token_script_answers_its_prompt_with_its_prompt_tokens() -> None:
    harness = ServerHarness()
    harness.set_tokens_and_logprobs_response(
        prompt="Hi",
        prompt_tokens=[1, 72, 105],
        output_tokens_list=[[33], [63, 63]],
        output_logprobs_list=[[-0.5], [-0.1, -0.2]],
        finish_reasons=["stop", "length"],
    )
    answer = await harness.tokens_and_logprobs_completion(prompt="Hi", input_ids=[72, 105])
    assert answer == ([1, 72, 105], [[33], [63, 63]], [[-0.5], [-0.1, -0.2]], ["stop", "length"])
    answer[1][0].append(99)
    assert (await harness.tokens_and_logprobs_completion(prompt="Hi"))[1][0] == [33]
    with pytest.raises(KeyError, match="'Bye'"):
        await harness.tokens_and_logprobs_completion(prompt="Bye")


@pytest.mark.parametrize(
    ("logprobs", "reasons", "message"),
    [
        ([[-0.1]], ["stop", "stop"], "finish_reasons 2; output_tokens_list has 1"),
        ([[-0.1, -0.2]], ["stop"], r"output_logprobs_list\[0\] has 2 logprobs for 1 tokens"),
    ],
)
def test_a_token_script_with_rows_that_disagree_is_refused(
    logprobs: list[list[float]], reasons: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ServerHarness().set_tokens_and_logprobs_response("p", [1], [[7]], logprobs, reasons)


async def test_prompt_logprobs_are_the_tests_to_provide() -> None:
    harness = ServerHarness()
    with pytest.raises(NotImplementedError, match="does not implement get_logprobs"):
        await harness.get_logprobs(prompt="x")


def test_a_test_may_take_the_harness_out_of_rotation() -> None:
    harness = ServerHarness()
    assert harness.server_healthy
    harness.server_healthy = False
    assert not harness.server_healthy


def test_helpers_build_one_choice_per_reply() -> None:
    chat = create_chat_completion(["a", "b"], n=2, finish_reason=["stop", "length"])
    assert [(c.index, c.message.content, c.finish_reason) for c in chat.choices] == [
        (0, "a", "stop"),
        (1, "b", "length"),
    ]
    with pytest.raises(ValueError, match="1 values given for n=2"):
        create_completion(["a"], n=2)


async def test_the_testing_manager_splits_a_token_request_like_generate() -> None:
    manager = ServerManager([], testing=True, max_n_completions=2)
    manager.servers[0].tokenizer = ChatCharTokenizer()
    prompt, outputs, logprobs, reasons = await manager.tokens_and_logprobs_completion(
        prompt="ab", n=5, max_tokens=2
    )
    assert prompt == [1, 97, 98], "a prompt alone is tokenized like /completions does"
    assert len(outputs) == len(logprobs) == len(reasons) == 5
    await manager.close()
