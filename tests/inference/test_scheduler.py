"""The scheduler's lifecycle with a scripted model: swaps, fairness, cancellation, failures.

The fake runner emits token ``k`` as a row's ``k``-th output (so a resumed row shows any
token it lost or repeated) and counts decode steps; the worker thread is the real one.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from atroposlib.inference.batch import Sequence
from atroposlib.inference.jobs import JobCancelled
from atroposlib.inference.sampling import SamplingParams
from atroposlib.inference.scheduler import Scheduler


class ScriptedBatch:
    def __init__(self, rows: list[Sequence]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def merge(self, other: ScriptedBatch) -> None:
        self.rows += other.rows

    def keep(self, indices: list[int]) -> None:
        self.rows = [self.rows[i] for i in indices]


class ScriptedRunner:
    """Appends ``len(output_ids)`` to each row; :meth:`hold` stops the worker in a step."""

    def __init__(self) -> None:
        self.model: object = "v0"
        self.decode_steps = 0
        self.decoded_rows: list[list[Sequence]] = []
        self.fail_next = False
        self.held_at: int | None = None
        self._holding = False
        self._lock = threading.Condition()

    def hold(self) -> None:
        """The next decode step waits (inside the step) until :meth:`release`."""
        with self._lock:
            self._holding = True

    def release(self) -> None:
        with self._lock:
            self._holding = False
            self._lock.notify_all()

    def _emit(self, rows: list[Sequence]) -> None:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("scripted failure")
        for row in rows:
            row.output_ids.append(len(row.output_ids))
            row.logprobs.append(-1.0)
            if len(row.output_ids) >= row.params.max_new_tokens:
                row.finish_reason = "length"

    def abort(self, row: Sequence) -> None:
        row.finish_reason = "abort"

    def install(self, tensors: dict[str, Any]) -> None:
        if "bad" in tensors:
            raise KeyError("the served model has no parameter 'bad'")
        self.model = tensors.get("model", self.model)

    def prefill(self, rows: list[Sequence]) -> ScriptedBatch:
        self._emit(rows)
        return ScriptedBatch(list(rows))

    def decode(self, batch: ScriptedBatch) -> int:
        with self._lock:
            if self._holding:
                self.held_at = self.decode_steps
                while self._holding:
                    self._lock.wait()
        self.decode_steps += 1
        self.decoded_rows.append(list(batch.rows))
        self._emit(batch.rows)
        return len(batch.rows)


def rows(count: int, tokens: int) -> list[Sequence]:
    return [Sequence([1, 2], SamplingParams(max_new_tokens=tokens)) for _ in range(count)]


@pytest.fixture
async def scheduler() -> AsyncIterator[tuple[Scheduler, ScriptedRunner]]:
    runner = ScriptedRunner()
    scheduler = Scheduler(runner, max_batch_size=4)  # type: ignore[arg-type]
    scheduler.start()
    yield scheduler, runner
    runner.release()
    await asyncio.to_thread(scheduler.stop)


async def until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.005)


async def held_step(runner: ScriptedRunner) -> int:
    """Wait until the worker is held inside a decode step; that step's index."""
    await until(lambda: runner.held_at is not None)
    assert runner.held_at is not None
    return runner.held_at


async def test_requests_queued_behind_a_swap_are_answered(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    """The demo's stall: the worker took queued rows off the queue in the turn that
    installed new weights, then dropped them; their requests were never answered."""
    sched, runner = scheduler
    runner.hold()
    first = sched.submit(rows(1, 3))
    await held_step(runner)
    swap = asyncio.create_task(sched.swap_weights("v1"))  # type: ignore[arg-type]
    behind = [sched.submit(rows(2, 3)) for _ in range(3)]
    await asyncio.sleep(0.05)
    runner.release()
    assert len(await asyncio.wait_for(first.result(), 5)) == 1
    assert await asyncio.wait_for(swap, 5) == 1
    for job in behind:
        done = await asyncio.wait_for(job.result(), 5)
        assert [seq.weight_version for seq in done] == [1, 1]
    assert (await asyncio.wait_for(first.result(), 5))[0].weight_version == 0


async def test_a_small_request_is_not_starved_by_a_huge_one(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    runner.hold()
    huge = sched.submit(rows(40, 50))  # 500 steps of a full batch
    step = await held_step(runner)
    small_job = sched.submit(rows(1, 2))
    runner.release()
    small = await asyncio.wait_for(small_job.result(), 10)
    assert small[0].output_ids == [0, 1]
    steps_with_small = [k for k, batch in enumerate(runner.decoded_rows) if small[0] in batch]
    # the step in flight ends; the next turn preempts a huge row and prefills the small one
    # (token 0); one decode step later it has its 2 tokens
    assert steps_with_small == [step + 2]
    done = await asyncio.wait_for(huge.result(), 30)
    # preempted rows resumed where they stopped: every row is exactly 0..49
    assert all(seq.output_ids == list(range(50)) for seq in done)
    assert sched.stats.preemptions >= 1


async def test_a_cancelled_job_leaves_the_batch_before_the_next_step(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    runner.hold()
    other = sched.submit(rows(1, 30))
    leaving = sched.submit(rows(3, 1000))
    step = await held_step(runner)
    sched.cancel(leaving)
    runner.release()
    with pytest.raises(JobCancelled):
        await asyncio.wait_for(leaving.result(), 5)
    assert len((await asyncio.wait_for(other.result(), 10))[0].output_ids) == 30
    assert len(runner.decoded_rows[step]) == 4  # the step in flight when the client left
    assert all(len(batch) == 1 for batch in runner.decoded_rows[step + 1 :])
    assert sched.stats.cancelled_requests == 1 and sched.stats.sequences_waiting == 0


async def test_a_failed_step_fails_its_jobs_and_the_worker_goes_on(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    runner.fail_next = True
    with pytest.raises(RuntimeError, match="scripted failure"):
        await asyncio.wait_for(sched.submit(rows(2, 3)).result(), 5)
    done = await asyncio.wait_for(sched.generate(rows(2, 3)), 5)
    assert [seq.output_ids for seq in done] == [[0, 1, 2]] * 2


async def test_streaming_jobs_get_every_token_once_in_order(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, _ = scheduler
    crowd = sched.submit(rows(6, 20))  # shares the batch of 4 with the streamed rows
    job = sched.submit(rows(3, 12), stream=True)
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    reasons: dict[int, str | None] = {}
    async for updates in job.updates():
        for update in updates:
            assert reasons.get(update.index) is None, "a token after the finish"
            seen[update.index] += update.token_ids
            reasons[update.index] = update.finish_reason
    assert seen == {i: list(range(12)) for i in range(3)}
    assert reasons == {0: "length", 1: "length", 2: "length"}
    await asyncio.wait_for(crowd.result(), 10)


async def test_shutdown_fails_what_is_left(scheduler: tuple[Scheduler, ScriptedRunner]) -> None:
    sched, runner = scheduler
    runner.hold()
    job = sched.submit(rows(8, 10**9))
    await held_step(runner)
    runner.release()
    await asyncio.to_thread(sched.stop)
    with pytest.raises(RuntimeError, match="shutting down"):
        await asyncio.wait_for(job.result(), 5)


# -- pause modes and weights installed in flight ---------------------------------------


async def test_keep_freezes_rows_and_they_continue_on_the_new_weights(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    runner.hold()
    job = sched.submit(rows(2, 8))
    step = await held_step(runner)
    pause = asyncio.create_task(sched.pause("keep"))
    await asyncio.sleep(0.05)  # the command waits in the inbox for the step to end
    runner.release()
    await asyncio.wait_for(pause, 5)
    frozen_at = runner.decode_steps
    queued = sched.submit(rows(1, 2))  # arrives while paused: waits, is not refused
    await asyncio.sleep(0.1)
    assert runner.decode_steps == frozen_at and not job.settled and not queued.settled
    assert sched.stats.paused == "keep"
    assert await asyncio.wait_for(sched.install_weights({"model": "v7"}, 7), 5) == 7
    await asyncio.wait_for(sched.resume(), 5)
    done = await asyncio.wait_for(job.result(), 5)
    # the prefill and `step + 1` decode steps ran before the pause (the held step included)
    before = step + 2
    for seq in done:
        assert seq.output_ids == list(range(8))  # nothing lost or repeated across the pause
        assert seq.version_spans() == [(0, 0, before), (7, before, 8)]
    assert (await asyncio.wait_for(queued.result(), 5))[0].version_spans() == [(7, 0, 2)]
    assert runner.model == "v7"


async def test_wait_answers_once_started_rows_drain_and_admits_nothing_new(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    runner.hold()
    started = sched.submit(rows(4, 6))
    await held_step(runner)
    unstarted = sched.submit(rows(2, 3))
    pause = asyncio.create_task(sched.pause("wait"))
    await asyncio.sleep(0.05)
    assert not pause.done()
    runner.release()
    await asyncio.wait_for(pause, 5)
    assert [len(s.output_ids) for s in await asyncio.wait_for(started.result(), 1)] == [6] * 4
    await asyncio.sleep(0.05)
    assert not unstarted.settled  # paused: the queued request did not start
    await sched.install_weights({}, 3)
    await sched.resume()
    assert [s.version_spans() for s in await asyncio.wait_for(unstarted.result(), 5)] == [
        [(3, 0, 3)]
    ] * 2


async def test_abort_answers_every_request_with_what_it_has(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    runner.hold()
    running = sched.submit(rows(4, 50))
    step = await held_step(runner)
    queued = sched.submit(rows(2, 50))
    streamed = sched.submit(rows(1, 50), stream=True)
    pause = asyncio.create_task(sched.pause("abort"))
    await asyncio.sleep(0.05)
    runner.release()
    await asyncio.wait_for(pause, 5)
    cut = await asyncio.wait_for(running.result(), 5)
    assert {s.finish_reason for s in cut} == {"abort"}
    assert [s.output_ids for s in cut] == [list(range(step + 2))] * 4
    assert [s.output_ids for s in await queued.result()] == [[], []]
    reasons = [u.finish_reason async for batch in streamed.updates() for u in batch]
    assert reasons == ["abort"]
    assert sched.stats.aborted_sequences == 7
    assert sched.stats.paused == "abort"
    late = sched.submit(rows(1, 2))
    await asyncio.sleep(0.05)
    assert not late.settled
    await sched.resume()
    assert (await asyncio.wait_for(late.result(), 5))[0].output_ids == [0, 1]


async def test_install_between_steps_without_a_pause_and_a_refused_install(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    runner.hold()
    job = sched.submit(rows(1, 40))
    step = await held_step(runner)
    refused = asyncio.create_task(sched.install_weights({"bad": "x"}, 9))
    installed = asyncio.create_task(sched.install_weights({"model": "v1"}, None))
    await asyncio.sleep(0.05)
    runner.release()
    with pytest.raises(KeyError, match="bad"):
        await asyncio.wait_for(refused, 5)
    assert await asyncio.wait_for(installed, 5) == 1
    switch = step + 2  # tokens of the prefill and of the held step came from version 0
    spans = (await asyncio.wait_for(job.result(), 10))[0].version_spans()
    assert spans == [(0, 0, switch), (1, switch, 40)]


async def test_recompute_running_preempts_every_row(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    runner.hold()
    job = sched.submit(rows(3, 10))
    await held_step(runner)
    pause = asyncio.create_task(sched.pause("keep"))
    await asyncio.sleep(0.05)
    runner.release()
    await asyncio.wait_for(pause, 5)
    await asyncio.wait_for(sched.recompute_running(), 5)
    await sched.resume()
    done = await asyncio.wait_for(job.result(), 5)
    assert all(seq.output_ids == list(range(10)) for seq in done)
    assert sched.stats.preemptions == 3


async def test_stats_count_the_rows_each_step_computed_and_the_time_in_steps(
    scheduler: tuple[Scheduler, ScriptedRunner],
) -> None:
    sched, runner = scheduler
    await asyncio.wait_for(sched.submit(rows(3, 4)).result(), 5)
    await until(lambda: sched.stats.decode_steps == runner.decode_steps)
    assert runner.decode_steps == 3  # the prefill sampled the first token
    assert sched.stats.computed_rows == sum(len(step) for step in runner.decoded_rows) == 9
    assert sched.stats.busy_seconds > sched.stats.prefill_seconds > 0
