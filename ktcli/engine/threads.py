"""The engine's thread governor: `ktcli.threads` timing its decode steps."""

from __future__ import annotations

import torch

from ktcli.threads import FIRST_PROBE, IDLE_FIRST_PROBE, CpuSample, ThreadGovernor, busy_elsewhere, starting_threads


def govern(engine, threads: int, load_started: CpuSample | None) -> None:
    """Give a CPU engine a ThreadGovernor, unless the user fixed `threads` (> 0): the
    CLI's and the server's default. It starts from the cores other processes left idle
    since `load_started` (taken before the model loaded). Results can then differ in the
    last bits from a run at another count, so tests and benchmarks that compare runs do
    not call this."""
    if threads > 0 or engine.device.type != "cpu":
        return
    most = torch.get_num_threads()
    others = busy_elsewhere(load_started)
    start = starting_threads(most, others)
    idle = others is not None and start == most
    engine.threads = ThreadGovernor(most, start=start, first_probe=IDLE_FIRST_PROBE if idle else FIRST_PROBE)
