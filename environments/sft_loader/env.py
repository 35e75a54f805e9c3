"""SFT loader: streams supervised rows into the broker as one-sequence groups.

Each row becomes a group of one sequence with ``group_overrides {"sft": true, "group_size": 1}``
(the trainer takes a cross-entropy step on it); every assistant turn is trained. Rows may be
``{"messages": [...]}``, ``{"prompt", "completion"}``, ``{"prefix", "completion"}`` (the
``atropos-sft-gen`` output) or ``{"instruction", "input", "output"}`` (Alpaca). The source is a
local JSONL read lazily (``data_path``) or a hub dataset streamed with ``datasets``.
"""

import json
import logging
from collections.abc import Iterator

from pydantic import Field

from atroposlib.envs.base import BaseEnv, BaseEnvConfig
from atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atroposlib.errors import ConfigError
from atroposlib.group import ScoredData
from atroposlib.type_definitions import Item
from atroposlib.utils.chat_group import chat_group

logger = logging.getLogger(__name__)


class SFTLoaderConfig(BaseEnvConfig):
    data_path: str | None = Field(default=None, description="Local JSONL of SFT rows.")
    dataset_name: str | None = Field(default=None, description="Hub dataset, streamed.")
    dataset_split: str = Field(default="train", description="Split of dataset_name.")
    epochs: int = Field(default=1, ge=1, description="Passes over the data before stopping.")


def row_to_messages(row: dict) -> list[dict] | None:
    """A chat for any of the supported row shapes; None when the row has none of them.

    >>> row_to_messages({"prompt": "Hi", "completion": "Hello!"})
    [{'role': 'user', 'content': 'Hi'}, {'role': 'assistant', 'content': 'Hello!'}]
    >>> row_to_messages({"instruction": "Add", "input": "2+2", "output": "4"})[0]["content"]
    'Add\\n\\n2+2'
    >>> row_to_messages({"text": "no chat here"}) is None
    True
    """
    if isinstance(row.get("messages"), list) and row["messages"]:
        chat = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
        return chat if any(m["role"] == "assistant" for m in chat) else None
    prompt = row.get("prompt", row.get("prefix"))
    if isinstance(prompt, str) and isinstance(row.get("completion"), str):
        return [{"role": "user", "content": prompt},
                {"role": "assistant", "content": row["completion"]}]  # fmt: skip
    if isinstance(row.get("instruction"), str) and isinstance(row.get("output"), str):
        user = row["instruction"] + (f"\n\n{row['input']}" if row.get("input") else "")
        return [{"role": "user", "content": user}, {"role": "assistant", "content": row["output"]}]
    return None


class SFTLoaderEnv(BaseEnv):
    name = "sft_loader"
    env_config_cls = SFTLoaderConfig

    @classmethod
    def config_init(cls) -> tuple[SFTLoaderConfig, list[APIServerConfig]]:
        config = SFTLoaderConfig(
            tokenizer_name="HuggingFaceTB/SmolLM2-135M-Instruct",
            group_size=1,
            max_token_length=2048,
            total_steps=1000,
            steps_per_eval=0,
            ensure_scores_are_not_same=False,
        )
        return config, [
            APIServerConfig(
                model_name="default", base_url="http://localhost:9001/v1", server_type="embedded"
            )
        ]

    def rows(self) -> Iterator[dict]:
        for _ in range(self.config.epochs):
            if self.config.data_path is not None:
                with open(self.config.data_path, encoding="utf-8") as handle:
                    yield from (json.loads(line) for line in handle if line.strip())
            else:
                from datasets import load_dataset

                name, split = self.config.dataset_name, self.config.dataset_split
                yield from load_dataset(name, split=split, streaming=True)

    async def setup(self) -> None:
        if self.config.data_path is None and self.config.dataset_name is None:
            raise ConfigError("no SFT data: set --env.data_path (JSONL) or --env.dataset_name")
        self.stream, self.skipped = self.rows(), 0

    async def get_next_item(self) -> Item:
        for row in self.stream:
            messages = row_to_messages(row)
            if messages is not None:
                return messages
            self.skipped += 1
            logger.warning("SFT row %d skipped: no messages/prompt+completion", self.skipped)
        return None

    async def collect_trajectories(self, item: Item) -> tuple[ScoredData | None, list[Item]]:
        group = chat_group(
            self.tokenizer, [item], [1.0],
            overrides=[{"sft": True}], group_overrides={"sft": True, "group_size": 1},
            train_on_all_assistant_turns=True,
        )  # fmt: skip
        return group, []


if __name__ == "__main__":
    SFTLoaderEnv.cli()
