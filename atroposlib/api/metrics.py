"""Prometheus metrics of one broker app, in a registry of its own (``GET /metrics``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from atroposlib.api.broker import Broker

logger = logging.getLogger(__name__)

_DROP_PREFIX = "dropped_"


class BrokerCollector(Collector):
    """Reads queue depth and the broker's persisted counters at scrape time."""

    def __init__(self, broker: Callable[[], Broker | None]) -> None:
        self._broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self._broker()
        if broker is None:
            return
        groups = GaugeMetricFamily(
            "broker_queue_groups", "Groups queued, per env id", labels=["env_id"]
        )
        sequences = GaugeMetricFamily(
            "broker_queue_sequences", "Sequences queued, per env id", labels=["env_id"]
        )
        for env_id, (n_groups, n_sequences) in sorted(
            broker.queue_depth_by_env().items(), key=lambda item: str(item[0])
        ):
            label = "none" if env_id is None else str(env_id)
            groups.add_metric([label], n_groups)
            sequences.add_metric([label], n_sequences)
        yield groups
        yield sequences
        yield GaugeMetricFamily("broker_queued_bytes", "Stored bytes of queued groups",
                                value=broker.queued_bytes)  # fmt: skip
        yield GaugeMetricFamily("broker_current_step", "Trainer step of the last batch",
                                value=broker.current_step)  # fmt: skip
        counters = broker.counters
        dropped = CounterMetricFamily(
            "broker_groups_dropped", "Groups dropped, by reason", labels=["reason"]
        )
        for name, value in sorted(counters.items()):
            if name.startswith(_DROP_PREFIX):
                dropped.add_metric([name.removeprefix(_DROP_PREFIX)], value)
        yield dropped
        for name, help_text in (
            ("groups_in", "Groups accepted into the queue"),
            ("groups_out", "Groups handed to the trainer in new batches"),
            ("sequences_in", "Sequences accepted into the queue"),
            ("sequences_out", "Sequences handed to the trainer in new batches"),
            ("duplicates", "Groups answered as duplicates of an earlier group_id"),
            ("rejected_queue_full", "Groups refused with 503 because the queue was full"),
            ("batches_resent", "Batches sent again to a trainer that had not received them"),
            ("log_damage", "Damaged stretches of the store's log skipped or cut off at start"),
        ):
            yield CounterMetricFamily(f"broker_{name}", help_text, value=counters.get(name, 0))


class BrokerMetrics:
    def __init__(self, broker: Callable[[], Broker | None]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(BrokerCollector(broker))
        self.bytes_in = Counter(
            "broker_request_bytes", "Request body bytes received, as sent", registry=self.registry
        )
        self.bytes_out = Counter(
            "broker_response_bytes", "Response body bytes before compression",
            registry=self.registry,
        )  # fmt: skip
        self.batch_seconds = Histogram(
            "broker_batch_formation_seconds", "Time to answer GET /batch", registry=self.registry
        )
