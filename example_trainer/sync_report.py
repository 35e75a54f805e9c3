"""What one weight push did, for every sync strategy; and the error that stops the run."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SyncReport:
    step: int
    updated: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    """The trainer's time in the push (blocked), retries included."""
    pause_seconds: float = 0.0
    """From the pause to the resume of the last attempt (in-flight strategies)."""
    transfer_seconds: float = 0.0
    """From the first chunk sent to the resume of the last attempt (in-flight strategies)."""
    retries: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed

    def metrics(self) -> dict[str, float]:
        return {
            "sync/seconds": self.seconds,
            "sync/pause_seconds": self.pause_seconds,
            "sync/transfer_seconds": self.transfer_seconds,
            "sync/retries": float(self.retries),
            "sync/failed": float(len(self.failed)),
        }


class WeightSyncError(RuntimeError):
    """A server did not take new weights after every retry: the run stops (one line)."""

    def __init__(self, report: SyncReport) -> None:
        url, why = next(iter(report.failed.items()))
        more = f" (and {len(report.failed) - 1} more servers)" if len(report.failed) > 1 else ""
        super().__init__(
            f"weight sync of step {report.step} failed after {_attempts(report.retries + 1)}: "
            f"inference server {url} {why}{more}"
        )
        self.report = report


def _attempts(count: int) -> str:
    return "1 attempt" if count == 1 else f"{count} attempts"
