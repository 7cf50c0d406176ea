"""How many CPU threads torch's steps use, chosen by timing them: the engine's decode
steps (`engine.threads.govern`) and the embedder's batches (`retrieval.embedder`).

torch starts one thread per core. On a machine where another process is busy that can be
ruinous: a decode step runs a few OpenMP parallel regions per layer, each ending in a
barrier, and when the scheduler hands one of our threads' cores to the other process the
barrier waits for that thread's next time slice, milliseconds, a hundred times a token.
On the 2-core machine with one busy process, SmolLM2 decoded at 3.3 tok/s on 2 threads
and 36 on 1, and the README's question took 44 s instead of 17 (BENCHMARKS.md, "Threads
under load"). Which count is faster depends on what
else runs, and that changes while we run; so it is measured, not guessed.

`ThreadGovernor` times every decode step (per token) at the current count and, now and
then, steps at each other count of a halving ladder (N, N/2, ..., 1); the fastest median
wins. Probes start early (a run that starts under load should not wait long); while the
choice holds the gap between probes doubles, and it is kept long enough that probes cost
about PROBE_BUDGET of the run (a probed count that is far slower is dropped after one
step). A step several times slower than the current count's median (load just arrived)
probes at once. Prefill chunks are few and long, too costly to probe: they use the
current count, which starts at what the cores other processes left idle while the model
loaded suggest (`busy_elsewhere`, from /proc/stat). A `--threads` the user gave is never
overridden (`fixed`).
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

PROBE_STEPS = 3  # steps timed at each other count per probe
FIRST_PROBE = 2  # steps at the start count before the first probe
# ... when the machine was seen idle while the model loaded: load arriving later shows as a
# slow step (SLOWDOWN), so an early probe would only cost a short answer its speed (an
# idle run of 27 tokens decoded 8-40% slower with it).
IDLE_FIRST_PROBE = 32
MAX_INTERVAL = 1024  # most steps between probes while the choice holds
SLOWDOWN = 3.0  # a step this many times the current median probes at once, and ends a probe's count
PROBE_BUDGET = 0.03  # probes may cost about this share of the run's time
RECENT = 5  # samples kept per count


def thread_ladder(n: int) -> list[int]:
    """n, n/2, ..., 1: the counts worth trying."""
    out = [max(1, n)]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return out


@dataclass(frozen=True)
class CpuSample:
    """The machine's busy CPU time and this process's own, in seconds, at one moment."""

    wall: float
    busy: float
    own: float


def cpu_sample() -> CpuSample | None:
    """None where /proc/stat is not there to read (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    own = os.times()
    return CpuSample(time.monotonic(), (sum(fields[:8]) - idle) / tick, own.user + own.system)


def busy_elsewhere(since: CpuSample | None, now: CpuSample | None = None) -> float | None:
    """Cores other processes kept busy between two samples (ours taken out), or None when
    the interval is too short to tell (under ~0.1 s: /proc/stat counts 10 ms ticks)."""
    now = now or cpu_sample()
    if since is None or now is None or now.wall - since.wall < 0.1:
        return None
    others = (now.busy - since.busy) - (now.own - since.own)
    return max(0.0, others / (now.wall - since.wall))


def starting_threads(max_threads: int, others_busy: float | None) -> int:
    """The rung of the ladder that fits the cores left idle by others (all of them when
    that is unknown): under load even the first prefill, before any decode step is
    timed, should not run into the stalls (engine.threads module doc)."""
    if others_busy is None:
        return max_threads
    free = max_threads - others_busy
    return max([c for c in thread_ladder(max_threads) if c <= free + 0.5], default=1)


def fixed_count_warning(threads: int, others_busy: float | None, cores: int, setting: str = "--threads") -> str | None:
    """What to say where a thread count the user fixed (`setting`, e.g. --threads) asks
    for more cores than other processes left idle: every parallel region of a step then
    waits at its barrier for a thread whose core the scheduler gave away. With one busy
    process beside it the README's question took 2.5x as long on 2 threads as on 1
    (BENCHMARKS.md, "Threads under load"); under a load of ~12 on the 2 cores, 2 threads
    decoded at 0.7-1.2 tok/s and 1 at 24-39 (a one-off look, 2026-12-07, where
    OMP_WAIT_POLICY=PASSIVE and a short GOMP_SPINCOUNT did not help: 0.7-5.0 tok/s). The
    governor, which a fixed count turns off, would have chosen 1."""
    if threads <= 1 or others_busy is None or threads <= cores - others_busy + 0.5:
        return None
    return (f"{setting} {threads} while other processes keep ~{others_busy:.1f} of {cores} cores busy: the threads "
            "wait for each other's cores at every step, often several times slower than fewer threads; "
            f"leave {setting} unset (or 0) and ktcli chooses the count by timing its steps")


class ThreadGovernor:
    def __init__(self, max_threads: int, *, fixed: bool = False, start: int | None = None,
                 first_probe: int = FIRST_PROBE,
                 set_threads: Callable[[int], None] = torch.set_num_threads) -> None:
        self.candidates = [max_threads] if fixed else thread_ladder(max_threads)
        self.current = start if start in self.candidates else self.candidates[0]
        self._set = set_threads
        self._applied = 0
        self._samples: dict[int, deque[float]] = {c: deque(maxlen=RECENT) for c in self.candidates}
        self._probe: list[int] = []  # counts still to time in the running probe
        self._probe_taken = 0
        self._interval = first_probe
        self._countdown = first_probe
        self.switches = 0  # times the choice changed (for the figures)

    @property
    def active(self) -> bool:
        return len(self.candidates) > 1

    def for_decode(self) -> int:
        """Set, and return, the count for the next decode step."""
        return self._apply(self._probe[0] if self._probe else self.current)

    def for_prefill(self) -> int:
        return self._apply(self.current)

    def decode_done(self, seconds: float, tokens: int) -> None:
        """Record a decode step that produced `tokens` tokens in `seconds`."""
        if not self.active or tokens <= 0:
            return
        per_token = seconds / tokens
        if self._probe:
            count = self._probe[0]
            self._samples[count].append(per_token)
            self._probe_taken += 1
            # One step far slower than the current count says enough (under load, a
            # probe of the full count costs a scheduling quantum per layer).
            hopeless = per_token > SLOWDOWN * statistics.median(self._samples[self.current])
            if self._probe_taken >= PROBE_STEPS or hopeless:
                self._probe.pop(0)
                self._probe_taken = 0
                if not self._probe:
                    self._decide()
            return
        recent = self._samples[self.current]
        surge = len(recent) >= 3 and per_token > SLOWDOWN * statistics.median(recent)
        recent.append(per_token)
        self._countdown -= 1
        if self._countdown <= 0 or surge:
            if surge:  # the old samples describe a machine that is gone
                recent.clear()
                recent.append(per_token)
            self._probe = [c for c in self.candidates if c != self.current]
            self._probe_taken = 0
            for c in self._probe:
                self._samples[c].clear()

    def _decide(self) -> None:
        timed = {c: statistics.median(s) for c, s in self._samples.items() if s}
        best = min(timed, key=lambda c: (timed[c], -c))
        # What the next probe would cost, in steps at the best count: at most PROBE_BUDGET
        # of the steps between probes.
        waste = sum(len(self._samples[c]) * max(0.0, timed[c] / timed[best] - 1) for c in timed if c != best)
        if best != self.current:
            self.current = best
            self.switches += 1
            interval = FIRST_PROBE * 4  # a new choice is checked again soon
        else:
            interval = self._interval * 2
        self._interval = min(max(interval, round(waste / PROBE_BUDGET)), MAX_INTERVAL)
        self._countdown = self._interval

    def released(self) -> None:
        """Another user of torch's setting has set it meanwhile (the embedder hands it back
        between its runs of batches): the next step sets its count again."""
        self._applied = 0

    def _apply(self, count: int) -> int:
        if count != self._applied:
            self._set(count)
            self._applied = count
        return count
