"""The thread governor (engine.threads) against simulated step times: it must find the
faster count quickly under load, cost little on an idle machine, and follow changes."""

from ktcli.threads import MAX_INTERVAL, PROBE_STEPS, ThreadGovernor, thread_ladder


def simulate(gov, cost, steps, start=0):
    """Run `steps` decode steps; cost(threads, step) -> seconds. Returns the counts used."""
    used = []
    for i in range(start, start + steps):
        count = gov.for_decode()
        used.append(count)
        gov.decode_done(cost(count, i), 1)
    return used


def recorder():
    calls = []
    return calls, calls.append


def test_ladder():
    assert thread_ladder(8) == [8, 4, 2, 1]
    assert thread_ladder(2) == [2, 1]
    assert thread_ladder(1) == [1] and thread_ladder(0) == [1]


def test_an_idle_machine_keeps_every_thread_and_probes_rarely():
    calls, set_threads = recorder()
    gov = ThreadGovernor(2, set_threads=set_threads)
    used = simulate(gov, lambda c, i: 0.010 if c == 2 else 0.014, 2000)
    assert gov.current == 2 and gov.switches == 0
    assert used.count(1) / len(used) < 0.02  # the probes' share of the steps
    assert used[-100:].count(1) <= PROBE_STEPS  # and it shrinks as the run goes on
    assert calls[0] == 2 and len(calls) == 2 * (used.count(1) // PROBE_STEPS) + 1  # set only on change


def test_under_load_the_single_thread_wins_within_a_few_steps():
    gov = ThreadGovernor(2, set_threads=lambda n: None)
    used = simulate(gov, lambda c, i: 0.5 if c == 2 else 0.018, 200)
    assert gov.current == 1 and gov.switches == 1
    assert used.index(1) <= 2 and used.count(2) <= 4  # a probe of the slow count stops after one step


def test_load_arriving_mid_run_is_noticed_at_once_and_leaving_is_noticed_later():
    gov = ThreadGovernor(2, set_threads=lambda n: None)
    simulate(gov, lambda c, i: 0.010 if c == 2 else 0.014, 600)
    assert gov.current == 2
    loaded = simulate(gov, lambda c, i: 0.4 if c == 2 else 0.016, 20, start=600)
    assert gov.current == 1
    assert loaded[:2 + PROBE_STEPS].count(1) >= PROBE_STEPS  # the slow step set off a probe
    assert loaded.count(2) <= 3
    # Probing the slow count again is costly while the load lasts, so probes grow rare
    # (PROBE_BUDGET); the load leaving is noticed within MAX_INTERVAL steps.
    simulate(gov, lambda c, i: 0.010 if c == 2 else 0.014, MAX_INTERVAL + 50, start=620)
    assert gov.current == 2


def test_more_cores_pick_the_best_rung():
    gov = ThreadGovernor(8, set_threads=lambda n: None)
    simulate(gov, lambda c, i: {8: 0.3, 4: 0.012, 2: 0.016, 1: 0.025}[c], 100)
    assert gov.current == 4


def test_a_count_the_user_set_is_kept():
    calls, set_threads = recorder()
    gov = ThreadGovernor(2, fixed=True, set_threads=set_threads)
    used = simulate(gov, lambda c, i: 0.5, 100)
    assert set(used) == {2} and calls == [2] and not gov.active
    assert gov.for_prefill() == 2


def test_the_first_count_fits_the_cores_others_leave_idle():
    from ktcli.threads import CpuSample, busy_elsewhere, starting_threads

    assert [starting_threads(2, busy) for busy in (None, 0.0, 0.3, 0.9, 2.0)] == [2, 2, 2, 1, 1]
    assert starting_threads(8, 0.5) == 8 and starting_threads(8, 3.0) == 4 and starting_threads(8, 7.9) == 1
    # 1 s in which the machine was busy 1.5 core-seconds, 0.5 of them ours: one core elsewhere
    assert busy_elsewhere(CpuSample(10.0, 100.0, 5.0), CpuSample(11.0, 101.5, 5.5)) == 1.0
    assert busy_elsewhere(CpuSample(10.0, 100.0, 5.0), CpuSample(10.05, 100.1, 5.0)) is None  # too short to tell
    gov = ThreadGovernor(2, start=1, set_threads=lambda n: None)
    assert gov.for_prefill() == 1 and gov.active


def test_seen_idle_at_load_the_first_probe_waits_and_load_is_still_caught():
    from ktcli.threads import IDLE_FIRST_PROBE

    gov = ThreadGovernor(2, first_probe=IDLE_FIRST_PROBE, set_threads=lambda n: None)
    assert simulate(gov, lambda c, i: 0.010 if c == 2 else 0.014, IDLE_FIRST_PROBE) == [2] * IDLE_FIRST_PROBE
    loaded = simulate(gov, lambda c, i: 0.4 if c == 2 else 0.016, 10, start=IDLE_FIRST_PROBE)
    assert gov.current == 1 and loaded.count(2) <= 2


def test_a_fixed_count_the_other_processes_leave_no_cores_for_is_warned_of(monkeypatch):
    """--threads 2 under a load of ~12 on 2 cores decoded 20x slower than 1 thread, and
    said nothing (the governor, which would choose 1, is off for a fixed count)."""
    import types

    import torch

    from ktcli.engine import threads as engine_threads
    from ktcli.threads import CpuSample, fixed_count_warning

    said = fixed_count_warning(2, 1.8, 2, "KTCLI_THREADS")
    assert said.startswith("KTCLI_THREADS 2 while other processes keep ~1.8 of 2 cores busy")
    assert "leave KTCLI_THREADS unset (or 0)" in said
    # room enough, one thread, or a load not measured: nothing to say
    assert [fixed_count_warning(*args) for args in ((2, 0.4, 2), (4, 3.0, 8), (1, 2.0, 2), (2, None, 2))] == [None] * 4
    assert fixed_count_warning(4, 5.0, 8) is not None

    # govern: a fixed count gets no governor, and the warning where it is crowded
    monkeypatch.setattr(engine_threads, "_cores", lambda: 2)
    busy = (CpuSample(10.0, 100.0, 5.0), CpuSample(11.0, 102.3, 5.5))  # 1.8 cores elsewhere
    monkeypatch.setattr(engine_threads, "busy_elsewhere", lambda since: 1.8 if since is busy[0] else 0.0)
    engine = types.SimpleNamespace(device=torch.device("cpu"), threads=None)
    assert "--threads 2 while" in engine_threads.govern(engine, 2, busy[0]) and engine.threads is None
    assert engine_threads.govern(engine, 2, None) is None  # idle
    assert engine_threads.govern(engine, 0, busy[0]) is None and engine.threads is not None  # governed, unsaid
