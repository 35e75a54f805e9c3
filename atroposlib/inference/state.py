"""What the server's lifespan owns: the model runner, its scheduler, and served names."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

from fastapi import Request

from atroposlib.inference.engine import ModelRunner
from atroposlib.inference.sample_log import SampleLog
from atroposlib.inference.scheduler import Scheduler
from atroposlib.inference.settings import InferenceSettings
from atroposlib.inference.weight_transfer import Staging, new_shm_prefix, staging_executor


@dataclass
class ServerState:
    settings: InferenceSettings
    runner: ModelRunner
    scheduler: Scheduler
    started: int
    base_path: str
    lora_names: list[str] = field(default_factory=list)
    swap_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    transport: str | None = None
    """How weight chunks arrive (``http``/``shm``), once ``/init_weight_transfer_engine`` ran."""
    staging: Staging | None = None
    """The weight update in progress (``/start_weight_update`` .. ``/finish_weight_update``)."""
    staging_pool: ThreadPoolExecutor = field(default_factory=staging_executor)
    """Where chunks are decoded and copied (one thread; shut down with the app)."""
    uploads: int = 0
    """``/update_weights`` calls reading or staging a chunk now."""
    shm_prefix: str = field(default_factory=new_shm_prefix)
    """Shared-memory blocks this server opens are named with it (announced at init)."""

    def __post_init__(self) -> None:
        self.token_text = lru_cache(maxsize=65536)(self._decode_one)
        self.sample_log = SampleLog(self.settings.sample_log)
        template = self.settings.chat_template
        self.chat_template = template.read_text() if template is not None else None
        """The ``--chat-template`` in use instead of the model's (None: the model's)."""

    @property
    def model_names(self) -> list[str]:
        return [self.settings.model_name, *self.lora_names]

    def _decode_one(self, token_id: int) -> str:
        return str(self.runner.tokenizer.decode([token_id]))


def server_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.inference
    return state
