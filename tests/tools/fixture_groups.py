"""The fixture groups the tools' tests read: real chat-template tokens of the test model.

``data/groups.jsonl`` is what :func:`build_groups` returns, one group per line (the env
``process`` dump format); ``test_fixture_file_is_current`` checks the file still matches, and
``python -m tests.tools.fixture_groups`` rewrites it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
GROUPS_PATH = DATA / "groups.jsonl"

# (env_id, question, [(completion, score), ...]); group size 4 each.
FIXTURE: list[tuple[int, str, list[tuple[str, float]]]] = [
    (0, "What is 2+3?", [("2 + 3 = 5", 1.0), ("2 + 3 = 6", -1.0), ("5", 0.5), ("7", 0.0)]),
    (1, "Name a primary colour.", [("Red", 1.0), ("Blue", 0.9), ("Green", 0.2), ("Mauve", -0.5)]),
    (0, "Say hi.", [("hi", 0.0), ("hello", 0.0), ("hey", 0.0), ("yo", 0.0)]),
]


def _group(tokenizer: Any, env_id: int, question: str, answers: list[tuple[str, float]]) -> dict:
    chat = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    scores = [score for _, score in answers]
    mean = sum(scores) / len(scores)
    group: dict[str, Any] = {
        "tokens": [],
        "masks": [],
        "scores": scores,
        "advantages": [],
        "inference_logprobs": [],
        "messages": [],
        "env_id": env_id,
    }
    for answer, score in answers:
        answer_ids = tokenizer(answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
        group["tokens"].append(prompt_ids + answer_ids)
        group["masks"].append([-100] * len(prompt_ids) + answer_ids)
        group["advantages"].append([0.0] * len(prompt_ids) + [score - mean] * len(answer_ids))
        group["inference_logprobs"].append(
            [1.0] * len(prompt_ids) + [-0.25 * (k % 4) for k in range(len(answer_ids))]
        )
        group["messages"].append([*chat, {"role": "assistant", "content": answer}])
    return group


def build_groups(tokenizer: Any) -> list[dict]:
    return [_group(tokenizer, *entry) for entry in FIXTURE]


def dump(groups: list[dict]) -> str:
    return "".join(json.dumps(group) + "\n" for group in groups)


if __name__ == "__main__":
    from transformers import AutoTokenizer

    from atroposlib.utils.test_model import ensure_test_model

    GROUPS_PATH.write_text(dump(build_groups(AutoTokenizer.from_pretrained(ensure_test_model()))))
