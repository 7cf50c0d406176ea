"""The engine's thread governor: `ktcli.threads` timing its decode steps."""

from __future__ import annotations

import os

import torch

from ktcli.threads import (FIRST_PROBE, IDLE_FIRST_PROBE, CpuSample, ThreadGovernor, busy_elsewhere,
                           fixed_count_warning, starting_threads)


def govern(engine, threads: int, load_started: CpuSample | None, setting: str = "--threads") -> str | None:
    """Give a CPU engine a ThreadGovernor, unless the user fixed `threads` (> 0): the
    CLI's and the server's default. It starts from the cores other processes left idle
    since `load_started` (taken before the model loaded). Results can then differ in the
    last bits from a run at another count, so tests and benchmarks that compare runs do
    not call this. Returns a warning where the count fixed (named `setting`) asks for
    more cores than others left idle (`fixed_count_warning`)."""
    if engine.device.type != "cpu":
        return None
    others = busy_elsewhere(load_started)
    if threads > 0:
        return fixed_count_warning(threads, others, _cores(), setting)
    most = torch.get_num_threads()
    start = starting_threads(most, others)
    idle = others is not None and start == most
    engine.threads = ThreadGovernor(most, start=start, first_probe=IDLE_FIRST_PROBE if idle else FIRST_PROBE)
    return None


def _cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
