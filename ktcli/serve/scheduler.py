"""One engine thread; many HTTP threads. Requests queue here and run in batches.

When the engine is free, the first waiting request opens a short window (`gather_s`) in
which more requests join, up to `max_batch`, and the group runs as one batch. Requests
arriving during a run join it at the engine's next step where the runner can take them
(`runner.joins`: our engine), up to `max_batch` running at once; else they queue for the
next batch. Only requests with the same sampling parameters share a batch (the engines
sample a batch one way).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from ktcli.engine.batching import Job, Runner, sampling_key


@dataclass
class SchedulerStats:
    batches: int = 0
    jobs: int = 0
    largest_batch: int = 0
    busy_s: float = 0.0

    run_started: float | None = None  # perf_counter of the run in progress, if any

    def as_dict(self) -> dict:
        # A run of the engine takes requests in while it runs (continuous batching): the
        # requests it served over its life may outnumber the most it held at once, so they
        # are "per run", not a "mean batch" (which read 2.5 beside a largest batch of 2).
        # The run in progress counts: under steady load one run lasts for minutes, and
        # /health said "runs": 0, "busy_s": 0.0 beside "requests": 7 all along.
        started = self.run_started
        runs = self.batches + (started is not None)
        busy = self.busy_s + (time.perf_counter() - started if started is not None else 0.0)
        return {"runs": runs, "requests": self.jobs, "largest_batch": self.largest_batch,
                "requests_per_run": round(self.jobs / runs, 2) if runs else 0.0,
                "busy_s": round(busy, 2)}


SHUTTING_DOWN = "the server is shutting down"


class Scheduler:
    def __init__(self, runner: Runner, *, gather_s: float = 0.03, max_batch: int | None = None) -> None:
        self.runner = runner
        self.gather_s = gather_s
        self.max_batch = max(1, max_batch or runner.max_batch)
        self.stats = SchedulerStats()
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []  # the batch the engine runs now
        self._cv = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="ktcli-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait_s: float = 0.0) -> bool:
        """Stop taking work; end what waits and runs with an error (a cut-off answer must
        not read as a whole one: it went out as finish_reason "cancelled", then [DONE],
        or a 200), and wait up to `wait_s` for the engine thread to leave its step. True
        when it has: a process that exits while the thread is inside the native kernels
        aborts ("terminate called without an active exception", exit 134)."""
        with self._cv:
            self._stopped = True
            for job in [*self._waiting, *self._running]:
                job.fail(SHUTTING_DOWN)
                job.cancel()
            self._cv.notify_all()
        if wait_s > 0 and self._thread.is_alive():
            self._thread.join(wait_s)
        return not self._thread.is_alive()

    def submit(self, *jobs: Job) -> None:
        """Queue `jobs` at once (a request's several choices), so that one batch takes
        them all where it has room, not the first alone. Once stopped, each is failed at
        once: a request read on a kept-alive connection while the server shut down (the
        engine finishing its step, up to a minute) waited for an engine that no longer
        took work, and its client got a reset at exit, not the 503 of the others."""
        with self._cv:
            if self._stopped:
                for job in jobs:
                    job.fail(SHUTTING_DOWN)
                return
            self._waiting.extend(jobs)
            self._cv.notify_all()

    @property
    def queued(self) -> int:
        with self._cv:
            return len(self._waiting)

    @property
    def running(self) -> int:
        """Requests the engine runs now (/health: "queued": 0 said nothing of 7 running)."""
        with self._cv:
            return sum(not job.finished for job in self._running)

    def stats_dict(self) -> dict:
        with self._cv:  # the run's start and end are written under it
            return self.stats.as_dict()

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if not batch:
                continue
            started = time.perf_counter()
            with self._cv:
                self._running = batch
                self.stats.run_started = started
            key = self._key(batch[0])
            join = (lambda room, key=key: self._join(key, room)) if getattr(self.runner, "joins", False) else None
            try:
                self.runner.run(batch, join)
            except Exception as e:  # noqa: BLE001 - the engine thread must survive any request
                with self._cv:
                    failed = list(self._running)  # the batch and the requests that joined it
                for job in failed:
                    job.fail(f"generation failed: {type(e).__name__}: {e}")
            finally:
                with self._cv:
                    self._running = []
                    self.stats.busy_s += time.perf_counter() - started
                    self.stats.batches += 1
                    self.stats.run_started = None

    def _next_batch(self) -> list[Job] | None:
        with self._cv:
            while not self._waiting and not self._stopped:
                self._cv.wait()
            if self._stopped:
                return None
            # The first request opens the gathering window; a full batch closes it early.
            deadline = time.monotonic() + self.gather_s
            while len(self._waiting) < self.max_batch and not self._stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            return self._take()

    def _join(self, key: tuple, room: int) -> list[Job]:
        """The oldest waiting requests, up to `room`, while they share the running batch's
        sampling; handed to the runner between two engine steps. A request of other
        sampling at the head stops the joining (it runs next, once the batch drains), so
        a stream of joiners cannot hold it back for ever."""
        with self._cv:
            joined: list[Job] = []
            while self._waiting and len(joined) < room and not self._stopped:
                job = self._waiting[0]
                if job.cancelled.is_set():
                    self._waiting.popleft().finish("cancelled")
                elif self._key(job) == key:
                    joined.append(self._waiting.popleft())
                else:
                    break
            if joined:
                self._running = [j for j in self._running if not j.finished] + joined
                self._count(len(self._running), len(joined))
            return joined

    def _key(self, job: Job) -> tuple:
        """Jobs of equal keys share a batch: all, where the runner samples each with its own
        params (`mixes_sampling`)."""
        return () if getattr(self.runner, "mixes_sampling", False) else sampling_key(job.params)

    def _count(self, running: int, new: int) -> None:
        self.stats.jobs += new
        self.stats.largest_batch = max(self.stats.largest_batch, running)

    def _take(self) -> list[Job]:
        """The oldest live request and every later one that can share its batch."""
        while self._waiting and self._waiting[0].cancelled.is_set():
            self._waiting.popleft().finish("cancelled")
        if not self._waiting:
            return []
        key = self._key(self._waiting[0])
        batch, rest = [], deque()
        while self._waiting:
            job = self._waiting.popleft()
            if job.cancelled.is_set():
                job.finish("cancelled")
            elif len(batch) < self.max_batch and self._key(job) == key:
                batch.append(job)
            else:
                rest.append(job)
        self._waiting = rest
        self._count(len(batch), len(batch))
        return batch
