"""The two keys of a local run, and which process gets which.

Every process gets the run key (sampling, posting groups, reading the status). The admin key
opens the rest (the trainer's batches, weight pushes, pause/resume, LoRA loading): the broker
and the inference server get it to check it, the trainer to use it; the environments and their
agents never see it. Both go through the environment, never a command line (``ps``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from atroposlib.security.keys import ADMIN_KEY_VARIABLE, KEY_VARIABLE, new_key

WITHHELD = (
    ADMIN_KEY_VARIABLE,
    "ATROPOS_INFERENCE_ADMIN_API_KEY",
    "ATROPOS_INFERENCE_API_KEY",
    "ATROPOS_TRAINER_BROKER_API_KEY",
    "ATROPOS_TRAINER_INFERENCE_API_KEY",
    "VLLM_API_KEY",
)
"""Key variables of the launching shell that no process of the run inherits: they would hand
an environment an admin key, or override the run's own keys (vLLM's own ``/v1`` key would
refuse the admin key; the guard checks both instead)."""


@dataclass(frozen=True)
class RunKeys:
    run: str = field(repr=False)
    admin: str = field(repr=False)

    @classmethod
    def generate(cls) -> RunKeys:
        return cls(run=new_key(), admin=new_key())

    def run_environment(self) -> dict[str, str]:
        """Every process's variables: the run key for the broker, the inference server and the
        env's ``openai`` servers."""
        return {KEY_VARIABLE: self.run, "ATROPOS_OPENAI__API_KEY": self.run}

    def admin_environment(self) -> dict[str, str]:
        """The servers' and the trainer's variable on top: the admin key."""
        return {ADMIN_KEY_VARIABLE: self.admin}
