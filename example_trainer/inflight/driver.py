"""One in-flight weight push, the same for every engine: pause, transfer, swap, resume, verify.

The order is vLLM's: pause every server in the configured mode (``keep``: requests in flight
freeze and continue on the new weights, reporting which tokens each version sampled; ``wait``:
they finish first and nothing new starts; ``abort``: they end now, and the env resubmits
them token-in), start, send the chunks, finish with ``weight_version`` = the trainer step,
reset the prefix cache, resume. An engine that stages chunks beside the served weights (the
embedded server) receives them before the pause, which then covers only the swap.

Then every server must read back the new version (and, with ``verify="checksum"``, agree on
the weights' checksums; the embedded server's must equal those of what was sent). A server
that did not take the update is reported and the whole push retried; after ``retries`` the
push returns its failures and the training loop stops with one line naming the server.
"""

from __future__ import annotations

import logging
import time
from typing import Literal, Protocol

from example_trainer.inflight.fleet import Fleet, SyncFailure
from example_trainer.inflight.tensors import PushedWeights
from example_trainer.sync_report import SyncReport

logger = logging.getLogger(__name__)

PauseMode = Literal["keep", "wait", "abort"]


class LiveEngine(Protocol):
    """What one engine's native weight-update API does for the driver (one call per phase)."""

    stages_before_pause: bool
    """True when chunks are staged beside the served weights, so they can arrive before the
    pause; False when they are written into the served weights (pause first)."""

    def connect(self, fleet: Fleet) -> None: ...
    def pause(self, fleet: Fleet, mode: PauseMode) -> None: ...
    def send(self, fleet: Fleet, weights: PushedWeights, version: str) -> None: ...
    def finish(self, fleet: Fleet, version: str) -> None: ...
    def after_swap(self, fleet: Fleet, recompute_kv: bool) -> None: ...
    def resume(self, fleet: Fleet) -> None: ...
    def versions(self, fleet: Fleet) -> dict[str, str]: ...
    def checksums(self, fleet: Fleet) -> dict[str, dict[str, str]] | None: ...
    def sent_checksums(self) -> dict[str, str] | None: ...
    def close(self) -> None: ...


class VllmRoutes:
    """The pause, resume and read-back calls of vLLM's control API, which the embedded
    server speaks too."""

    def pause(self, fleet: Fleet, mode: PauseMode) -> None:
        fleet.post_all("/pause", params={"mode": mode})

    def resume(self, fleet: Fleet) -> None:
        fleet.post_all("/resume")

    def versions(self, fleet: Fleet) -> dict[str, str]:
        return {url: str(a["weight_version"]) for url, a in fleet.get_all("/weight_info").items()}

    def checksums(self, fleet: Fleet) -> dict[str, dict[str, str]] | None:
        answers = fleet.post_all("/weight_checker", json={"action": "checksum"})
        return {url: dict(answer["checksums"]) for url, answer in answers.items()}


class LiveSync:
    """A weight-sync strategy (see ``example_trainer.weight_sync``) over an engine's live API."""

    writes: Literal["full", "adapter", "tensors"] = "tensors"

    def __init__(
        self,
        engine: LiveEngine,
        fleet: Fleet,
        *,
        pause: PauseMode = "keep",
        retries: int = 3,
        backoff: float = 0.5,
        verify: Literal["version", "checksum"] = "version",
        recompute_kv: bool = False,
    ) -> None:
        self.engine, self.fleet = engine, fleet
        self.pause_mode, self.retries, self.backoff = pause, retries, backoff
        self.verify, self.recompute_kv = verify, recompute_kv
        self._connected = False

    def start(self, model_path: str) -> None:
        """Servers are started by the user; the transfer is set up at the first push."""

    def push_live(self, weights: PushedWeights, step: int) -> SyncReport:
        report, started = SyncReport(step), time.perf_counter()
        version = str(step)
        for attempt in range(self.retries + 1):
            try:
                self._push_once(weights, version, report)
            except SyncFailure as failure:
                report.failed = failure.by_server
                report.retries = attempt
                logger.warning(
                    "weight push of step %d failed (attempt %d of %d%s): %s",
                    step, attempt + 1, self.retries + 1, ", final" if failure.final else "",
                    failure,
                )  # fmt: skip
                self._connected = False  # set the transfer up again before the next try
                if failure.final:
                    break
                if attempt < self.retries:
                    time.sleep(self.backoff * 2**attempt)
                continue
            report.failed, report.updated, report.retries = {}, list(self.fleet.urls), attempt
            break
        report.seconds = time.perf_counter() - started
        return report

    def _push_once(self, weights: PushedWeights, version: str, report: SyncReport) -> None:
        engine, fleet = self.engine, self.fleet
        if not self._connected:
            engine.connect(fleet)
            self._connected = True
        sent = time.perf_counter()
        if engine.stages_before_pause:
            engine.send(fleet, weights, version)
        paused = time.perf_counter()
        engine.pause(fleet, self.pause_mode)
        try:
            if not engine.stages_before_pause:
                engine.send(fleet, weights, version)
            engine.finish(fleet, version)
            engine.after_swap(fleet, self.recompute_kv)
        except BaseException:
            try:
                engine.resume(fleet)  # never leave a server paused, whatever failed
            except SyncFailure as failure:  # the first failure is the one to report
                logger.warning("could not resume after a failed push: %s", failure)
            raise
        else:
            engine.resume(fleet)
        finally:
            report.pause_seconds = time.perf_counter() - paused
            report.transfer_seconds = time.perf_counter() - sent
        self._check(version)

    def _check(self, version: str) -> None:
        wrong = {
            url: f"reports weight_version {got!r} after the update to {version!r}"
            for url, got in self.engine.versions(self.fleet).items()
            if got != version
        }
        if wrong:
            raise SyncFailure(wrong)
        if self.verify != "checksum":
            return
        digests = self.engine.checksums(self.fleet)
        if digests is None:
            return  # the engine has no weight checker (logged once by the engine)
        reference = self.engine.sent_checksums()
        if reference is None:  # compare the servers with each other
            reference = next(iter(digests.values()))
        wrong = {}
        for url, server in digests.items():
            differ = sorted(
                n for n in reference.keys() & server.keys() if reference[n] != server[n]
            )
            missing = sorted(reference.keys() - server.keys())
            if differ or missing:
                wrong[url] = f"weights differ after the update ({len(differ)} tensors differ, " + (
                    f"{len(missing)} missing; first: {(differ + missing)[0]})"
                )
        if wrong:
            raise SyncFailure(wrong)

    def close(self) -> None:
        self.engine.close()
        self.fleet.close()
