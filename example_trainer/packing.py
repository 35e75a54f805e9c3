"""Deprecated name of :mod:`example_trainer.sequence_packing`; this re-export goes in a later
release (the broker's batch packing is ``atroposlib.api.batching``)."""

from example_trainer.sequence_packing import (
    collate_packed,
    micro_batch,
    micro_batch_plan,
    model_logprobs,
    packed_costs,
    plan_packed,
    row_length,
    student_distill_logprobs,
)

__all__ = [
    "collate_packed",
    "micro_batch",
    "micro_batch_plan",
    "model_logprobs",
    "packed_costs",
    "plan_packed",
    "row_length",
    "student_distill_logprobs",
]
