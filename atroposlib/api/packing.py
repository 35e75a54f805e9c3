"""Deprecated name of :mod:`atroposlib.api.batching` (the broker's batch formation).

Renamed so that the broker's batch packing and the trainer's sequence packing
(``example_trainer.sequence_packing``) no longer share a name; this re-export goes in a
later release.
"""

from atroposlib.api.batching import (
    EnvShare,
    FairShareState,
    QueuedGroupRef,
    SizePool,
    form_batch,
    pick_reserved_amounts,
    reach,
)

__all__ = [
    "EnvShare",
    "FairShareState",
    "QueuedGroupRef",
    "SizePool",
    "form_batch",
    "pick_reserved_amounts",
    "reach",
]
