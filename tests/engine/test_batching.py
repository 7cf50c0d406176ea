"""Serving's runners: one request that fails in the engine does not fail the requests it
was batched with."""

from __future__ import annotations

import pytest

from ktcli.engine.backend import SamplingParams
from ktcli.engine.batching import Job, NativeRunner
from ktcli.engine.native import NativeBackend


def _events(job: Job) -> list[tuple[str, str]]:
    out = []
    while not job.events.empty():
        out.append(job.events.get_nowait())
    return out


@pytest.fixture(scope="module")
def runner(tiny_models) -> NativeRunner:
    runner = NativeRunner(NativeBackend.load(tiny_models["llama"], weights="fp32"))
    runner._decode = lambda ids: "".join(f" t{i}" for i in ids)  # the test model has no tokenizer
    return runner


def test_a_prompt_that_fails_alone_fails_alone(runner):
    params = SamplingParams(max_new_tokens=4)
    good = [Job([5, 6, 7, 8], params), Job([9, 10, 11], params)]
    bad = Job([5, runner.vocab_size + 7], params)  # past the embedding: the engine raises
    runner.run([good[0], bad, good[1]])
    for job in good:
        events = _events(job)
        assert events[-1] == ("done", "length") and job.completion_tokens == 4, events
    assert [kind for kind, _ in _events(bad)] == ["error"]
    alone = [Job([5, 6, 7, 8], params)]
    runner.run(alone)  # the engine still serves, with the same answer as in the batch
    assert _events(alone[0])[-1] == ("done", "length") and alone[0].completion_tokens == 4


def test_a_failure_after_tokens_were_streamed_fails_the_batch(runner, monkeypatch):
    params = SamplingParams(max_new_tokens=6)
    jobs = [Job([5, 6, 7], params), Job([8, 9], params)]
    real = runner.engine.generate

    def failing_midway(*args, **kwargs):
        for n, item in enumerate(real(*args, **kwargs)):
            if n == 3:
                raise RuntimeError("lost the device")
            yield item

    monkeypatch.setattr(runner.engine, "generate", failing_midway)
    runner.run(jobs)  # replaying would repeat text the clients already have
    for job in jobs:
        assert _events(job)[-1] == ("error", "generation failed: RuntimeError: lost the device")


def test_a_request_that_arrives_mid_run_joins_it_and_answers_as_alone(runner, monkeypatch):
    # Continuous batching: a 5-token request sent during a 300-token one waited 2.9 s for
    # it to end. It joins at the next engine step, ends first, and its tokens are those it
    # gets alone (greedy).
    greedy = SamplingParams(max_new_tokens=40)
    short_params = SamplingParams(max_new_tokens=3)
    alone = Job([21, 22, 23, 24, 25], short_params)
    runner.run([alone])
    expected = [text for kind, text in _events(alone) if kind == "text"]

    long_job, short = Job([5, 6, 7, 8], greedy), Job([21, 22, 23, 24, 25], short_params)
    order: list[str] = []
    offered = []

    def join(room: int) -> list[Job]:
        if long_job.completion_tokens >= 5 and not offered:  # mid-run
            offered.append(room)
            return [short]
        return []

    real_finish = Job.finish

    def finish(job, reason):
        order.append("short" if job is short else "long")
        real_finish(job, reason)

    monkeypatch.setattr(Job, "finish", finish)
    runner.run([long_job], join)
    assert offered and offered[0] == runner.max_batch - 1
    assert order == ["short", "long"]
    assert [text for kind, text in _events(short) if kind == "text"] == expected
    assert long_job.completion_tokens == 40 and runner.engine.blocks.num_used == 0


def test_hf_seeded_requests_get_their_seeds_tokens_in_a_batch(smollm2_hf_dir):
    # transformers samples a batch from one generator: two identical seeded requests sent
    # together gave two answers, neither the one each gets alone.
    from ktcli.engine.batching import HFRunner
    from ktcli.engine.hf_backend import HFBackend

    runner = HFRunner(HFBackend(smollm2_hf_dir, threads=2))
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=7)
    prompt = runner.encode_chat([{"role": "user", "content": "Name a colour."}])

    def texts(jobs):
        return ["".join(v for k, v in _events(j) if k == "text") for j in jobs]

    alone = [Job(prompt, params)]
    runner.run(alone)
    pair = [Job(prompt, params), Job(prompt, params)]
    runner.run(pair)
    assert texts(pair) == texts(alone) * 2


def test_a_long_prompt_that_joins_does_not_freeze_the_running_streams(tiny_models):
    # Prefill went first for every pending chunk: three long joiners froze a running
    # stream for 29 s. Now prefill chunks and decode steps alternate.
    from ktcli.engine.native import NativeBackend

    engine = NativeBackend.load(tiny_models["llama"], weights="fp32", prefill_chunk=64).engine
    long_prompt = [(i * 7) % 250 + 1 for i in range(320)]  # five chunks of 64
    calls = {"n": 0}

    def joining():
        calls["n"] += 1
        return [(long_prompt, SamplingParams(max_new_tokens=4))] if calls["n"] == 3 else []

    order = [i for i, _ in engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=30), frozenset(), joining)]
    first_joined = order.index(1)
    assert order[:first_joined].count(0) >= 2 + 4  # two before it joined, then one between each chunk
    # and each sequence's tokens are those it gets alone (greedy)
    alone = [t for _, t in engine.generate([long_prompt], SamplingParams(max_new_tokens=4), frozenset())]
    mixed = [t for i, t in engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=30), frozenset(),
                                           lambda c=iter(range(100)): [(long_prompt, SamplingParams(max_new_tokens=4))] if next(c) == 2 else [])
             if i == 1]
    assert mixed == alone and engine.blocks.num_used == 0


def test_a_request_cancelled_during_its_long_prompt_stops_at_the_next_step(tiny_models):
    """Cancels were looked at only when a token came out: a client gone (or a server
    stopping) during a long prompt kept the engine busy until the prompt was read."""
    backend = NativeBackend.load(tiny_models["llama"], weights="fp32", prefill_chunk=64)
    runner = NativeRunner(backend)
    runner._decode = lambda ids: "".join(f" t{i}" for i in ids)
    job = Job([(i * 7) % 250 + 1 for i in range(1280)], SamplingParams(max_new_tokens=4))  # 20 chunks
    asked = {"n": 0}

    def join(room):
        asked["n"] += 1
        if asked["n"] == 3:
            job.cancel()
        return []

    runner.run([job], join)
    assert _events(job)[-1] == ("done", "cancelled")
    assert backend.engine.stats.prefill_tokens <= 4 * 64 and backend.engine.blocks.num_used == 0


def test_a_short_prompt_that_joins_a_long_ones_prefill_answers_first(tiny_models):
    """Budget went to the oldest prompt until it was read whole: a 5-token request that
    joined during a 5K-token prompt waited for all of it."""
    from ktcli.engine.native import NativeBackend

    engine = NativeBackend.load(tiny_models["llama"], weights="fp32", prefill_chunk=64).engine
    long_prompt = [(i * 7) % 250 + 1 for i in range(640)]  # ten chunks of 64
    calls = {"n": 0}

    def joining():
        calls["n"] += 1
        return [([5, 6, 7], SamplingParams(max_new_tokens=3))] if calls["n"] == 2 else []

    order = [i for i, _ in engine.generate([long_prompt], SamplingParams(max_new_tokens=3), frozenset(), joining)]
    assert order[:3] == [1, 1, 1]  # the short one's three tokens before the long one's first


def test_a_short_prompt_that_joins_a_long_ones_prefill_shares_only_a_mixed_step(tiny_models, monkeypatch):
    """Its first token came in a step it shared with a whole chunk of the long prompt (a
    6K-token prompt's 2,048 tokens: 5.5 s to a short request's first token on 2 cores)."""
    from ktcli.engine import runner as runner_module
    from ktcli.engine.native import NativeBackend

    monkeypatch.setattr(runner_module, "MIXED_PREFILL_CHUNK", 32)
    engine = NativeBackend.load(tiny_models["llama"], weights="fp32", prefill_chunk=128).engine
    steps = []
    real = engine._step

    def step(batch, params):
        steps.append([(len(s.token_ids), n) for s, n in batch])
        return real(batch, params)

    engine._step = step
    calls = {"n": 0}

    def joining():
        calls["n"] += 1
        return [([5, 6, 7], SamplingParams(max_new_tokens=2))] if calls["n"] == 2 else []

    long_prompt = [(i * 7) % 250 + 1 for i in range(640)]
    list(engine.generate([long_prompt], SamplingParams(max_new_tokens=2), frozenset(), joining))
    assert steps[0] == [(640, 128)]  # alone, the long prompt reads whole chunks
    joined = next(k for k, batch in enumerate(steps) if (3, 3) in batch)
    assert sum(n for _, n in steps[joined]) <= 32  # the short prompt's step: a mixed one


def test_a_long_prompt_is_not_starved_by_a_stream_of_short_ones(tiny_models):
    """Shortest first: with question pages a long prompt's chunk fits no leftover budget,
    so short requests arriving before every step held it back for as long as they came."""
    from ktcli.engine.native import NativeBackend

    engine = NativeBackend.load(tiny_models["llama"], weights="fp32", kv_dtype="fp32", attention="topk",
                                block_size=16, prefill_chunk=64, kv_budget_bytes=16 << 20).engine
    long_prompt = [(i * 7) % 250 + 1 for i in range(300)]
    calls = {"n": 0}

    def joining():
        calls["n"] += 1
        return [([5, 6, 7, 8, 9], SamplingParams(max_new_tokens=1))] if calls["n"] < 60 else []

    order = [i for i, _ in engine.generate([long_prompt], SamplingParams(max_new_tokens=1), frozenset(), joining)]
    assert order.index(0) < 30  # the long prompt's token came while short ones still arrived


def test_streams_pause_for_at_most_a_mixed_steps_budget_when_a_long_prompt_joins(tiny_models, monkeypatch):
    from ktcli.engine import runner as runner_module
    from ktcli.engine.native import NativeBackend

    monkeypatch.setattr(runner_module, "MIXED_PREFILL_CHUNK", 32)
    engine = NativeBackend.load(tiny_models["llama"], weights="fp32", prefill_chunk=256).engine
    chunks = []
    real = engine._step

    def step(batch, params):
        chunks.extend(n for _, n in batch if n > 1)
        return real(batch, params)

    engine._step = step
    calls = {"n": 0}

    def joining():
        calls["n"] += 1
        return [([(i * 7) % 250 + 1 for i in range(300)], SamplingParams(max_new_tokens=2))] if calls["n"] == 3 else []

    list(engine.generate([[5, 6, 7]], SamplingParams(max_new_tokens=40), frozenset(), joining))
    assert chunks[0] == 3 and max(chunks[1:]) <= 32  # the joiner's prefill, cut to the mixed budget


def test_a_chunk_longer_than_a_mixed_steps_budget_still_runs(tiny_models, monkeypatch):
    """With question pages a prompt's chunks are cut as if alone, and may be longer than a
    step's budget while others decode: the step was empty and failed (IndexError)."""
    from ktcli.engine import runner as runner_module
    from ktcli.engine.native import NativeBackend

    monkeypatch.setattr(runner_module, "MIXED_PREFILL_CHUNK", 32)
    engine = NativeBackend.load(tiny_models["llama"], weights="fp32", kv_dtype="fp32", attention="topk",
                                block_size=16, prefill_chunk=64, kv_budget_bytes=16 << 20).engine
    long_prompt = [(i * 7) % 250 + 1 for i in range(300)]
    out = list(engine.generate([[5, 6, 7], long_prompt], SamplingParams(max_new_tokens=6), frozenset()))
    assert sorted({i for i, _ in out}) == [0, 1] and engine.blocks.num_used == 0


def test_a_sequence_that_ends_with_eos_is_reported_in_its_step(runner):
    # The engine does not yield EOS: a server answered such a request only when the
    # whole batch ended (and it held its batch slot until then).
    greedy = SamplingParams(max_new_tokens=20)
    first = [t for _, t in runner.engine.generate([[9, 10, 11]], greedy, frozenset())]
    eos = {first[2]}  # the short one's third token ends it
    seen: list[str] = []
    out = runner.engine.generate([[5, 6, 7, 8], [9, 10, 11]], greedy, eos,
                                 on_eos=lambda i: seen.append(f"eos {i}"))
    for i, _ in out:
        seen.append(f"token {i}")
    ended = seen.index("eos 1")
    assert seen[:ended].count("token 1") == 2 and "token 0" in seen[ended:]


def test_requests_of_different_sampling_share_a_batch_and_answer_as_alone(runner):
    """Each request samples with its own temperature, top-k, top-p and seed inside one
    batch: a request at OpenAI's default temperature waited behind a greedy stream (5.4 s
    to its first token). Its tokens are those it samples alone."""
    kinds = [SamplingParams(max_new_tokens=12), SamplingParams(max_new_tokens=12, temperature=0.8, seed=5),
             SamplingParams(max_new_tokens=9, temperature=1.3, top_k=20, seed=9),
             SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.9, seed=5)]
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13], [5, 6, 7, 8]]

    def texts(jobs):
        return [[text for kind, text in _events(j) if kind == "text"] for j in jobs]

    alone = []
    for prompt, params in zip(prompts, kinds):
        job = Job(prompt, params)
        runner.run([job])
        alone.append(texts([job])[0])
    together = [Job(p, k) for p, k in zip(prompts, kinds)]
    runner.run(together)
    assert texts(together) == alone
    assert [j.completion_tokens for j in together] == [12, 12, 9, 12]
    assert alone[0] != alone[3]  # the same prompt, greedy and sampled: the rows were not sampled alike


def test_the_server_batches_requests_of_any_sampling_on_our_engine(runner):
    from ktcli.serve.scheduler import Scheduler

    scheduler = Scheduler(runner, gather_s=0, max_batch=8)
    try:
        jobs = [Job([5, 6], SamplingParams(max_new_tokens=2)), Job([7, 8], SamplingParams(temperature=1.0, seed=1)),
                Job([9], SamplingParams(temperature=0.5, top_k=3))]
        with scheduler._cv:  # held: the scheduler's own thread takes nothing meanwhile
            scheduler._waiting.extend(jobs)
            assert scheduler._take() == jobs
    finally:
        scheduler.stop(0)


def test_a_long_prompt_tells_how_far_its_prefill_is(tiny_models):
    """A 30K-token prompt read for a minute with nothing said: each prefill step now tells
    the prompt tokens read so far, and the prefill's start is told too (a summary's part
    was first heard of a chunk in); a prompt read in one step tells nothing."""
    from ktcli.engine.native import NativeBackend

    backend = NativeBackend.load(tiny_models["llama"], weights="fp32", prefill_chunk=64)
    backend._decode = lambda ids: "".join(f" t{i}" for i in ids)  # the test model has no tokenizer
    told = []
    backend.on_prefill = lambda done, total: told.append((done, total))
    list(backend.stream_ids([(i * 7) % 250 + 1 for i in range(300)], SamplingParams(max_new_tokens=2)))
    assert told == [(0, 300), (64, 300), (128, 300), (192, 300), (256, 300), (300, 300)]
    told.clear()
    list(backend.stream_ids([5, 6, 7], SamplingParams(max_new_tokens=2)))
    assert told == []


def test_short_prompts_arriving_together_share_one_step(tiny_models, monkeypatch):
    """The mixed-step rule cut any step with a short prompt to 256 tokens: 16 requests of
    200 tokens arriving together took 13 prefill steps instead of 2."""
    from ktcli.engine import runner as runner_module
    from ktcli.engine.native import NativeBackend

    monkeypatch.setattr(runner_module, "MIXED_PREFILL_CHUNK", 32)
    engine = NativeBackend.load(tiny_models["llama"], weights="fp32", prefill_chunk=128).engine
    steps = []
    real = engine._step

    def step(batch, params):
        if any(n > 1 for _, n in batch):
            steps.append(sum(n for _, n in batch))
        return real(batch, params)

    engine._step = step
    prompts = [[(i * 7 + k) % 250 + 1 for i in range(20)] for k in range(5)]  # 5 x 20 tokens, each under 32
    list(engine.generate(prompts, SamplingParams(max_new_tokens=2), frozenset()))
    assert steps == [100]  # all five in one step: none of them waits for a mixed step of its own
    # beside a long one, the short ones still fit one step and the long one gets the rest of a mixed step
    steps.clear()
    long_prompt = [(i * 7) % 250 + 1 for i in range(300)]
    list(engine.generate([long_prompt] + prompts[:2], SamplingParams(max_new_tokens=2), frozenset()))
    assert steps[0] == 40 and all(n <= 128 for n in steps)


def test_the_runner_says_what_its_kv_pages_take_full_and_what_is_yet_to_come(runner, tiny_models):
    """`ktcli serve`'s start line adds to its RSS the pages requests have yet to write:
    float pages (torch.empty) all of them, pages of the kernels' format none (written at start)."""
    kv = runner.backend.kv
    assert runner.kv_bytes == kv.allocated_bytes > 0 and runner.kv_device == "cpu"
    assert runner.kv_unwritten_bytes == runner.kv_bytes
    assert runner.prefill_chunk > 0 and runner.widths == runner.backend.cfg.hidden_size + runner.backend.cfg.intermediate_size
    sparse = NativeRunner(NativeBackend.load(tiny_models["llama"], weights="fp32", kv_dtype="int8", attention="topk",
                                             kv_budget_bytes=4 << 20))
    assert sparse.kv_bytes > 0 and sparse.kv_unwritten_bytes == 0
