"""Prompts of one run that start the same way (questions about one document sent at once)
compute the shared rows once: a later prompt copies the whole prefill chunks they fill from
the sequence that has them, or waits while an earlier one computes them, and still gets the
tokens it gets alone."""

import pytest
import torch

from ktcli.engine.backend import SamplingParams
from ktcli.engine.native import NativeBackend

PARAMS = SamplingParams(max_new_tokens=10)


def random_ids(n, g):
    return torch.randint(0, 256, (n,), generator=g).tolist()


def run(backend, prompts, joining=None):
    out = [[] for _ in prompts]
    for i, tok in backend.engine.generate(prompts, PARAMS, frozenset(), joining):
        while len(out) <= i:
            out.append([])
        out[i].append(tok)
    return out, backend.engine.stats


def alone(backend, prompt):
    (tokens,), _ = run(backend, [prompt])
    return tokens


def scattered(backend, n_tables=6, tokens=32):
    """Hand pages out of order, as in a busy cache, so copies go through slot indexes."""
    hold = [[] for _ in range(n_tables)]
    for t in hold:
        backend.engine.blocks.grow(t, tokens)
    for t in hold[::2]:
        backend.engine.blocks.free(t)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_questions_sent_together_about_one_document_prefill_it_once(tiny_models, kind):
    g = torch.Generator().manual_seed(3)
    document = random_ids(200, g)
    prompts = [document + random_ids(n, g) for n in (9, 14, 6)]
    backend = NativeBackend.load(tiny_models[kind], weights="fp32", block_size=4, prefill_chunk=64)
    backend.engine.min_share = 32
    scattered(backend, tokens=8)
    together, st = run(backend, prompts)
    assert st.shared_tokens == 2 * 192  # the document's whole 64-token chunks; the rest as alone
    assert st.prefill_tokens == sum(len(p) for p in prompts) - 2 * 192
    assert together == [alone(backend, p) for p in prompts]


def test_sharing_off_prefills_every_prompt_and_gives_the_same_tokens(tiny_models):
    g = torch.Generator().manual_seed(4)
    document = random_ids(120, g)
    prompts = [document + random_ids(n, g) for n in (5, 8)]
    backend = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, prefill_chunk=64)
    backend.engine.min_share = 32
    shared, st = run(backend, prompts)
    assert st.shared_tokens == 64
    backend.engine.min_share = 0
    plain, st = run(backend, prompts)
    assert st.shared_tokens == 0 and st.prefill_tokens == sum(len(p) for p in prompts)
    assert shared == plain


def test_a_short_shared_start_is_not_worth_a_wait(tiny_models):
    # A chat template's few tokens of system prompt: each prompt prefills its own.
    g = torch.Generator().manual_seed(5)
    start = random_ids(20, g)
    prompts = [start + random_ids(n, g) for n in (90, 70)]
    backend = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, prefill_chunk=64)
    backend.engine.min_share = 32
    _, st = run(backend, prompts)
    assert st.shared_tokens == 0 and st.prefill_tokens == 200


def test_a_request_that_joins_mid_prefill_waits_for_the_document_then_copies_it(tiny_models):
    g = torch.Generator().manual_seed(6)
    document = random_ids(300, g)
    first, later = document + random_ids(7, g), document + random_ids(11, g)
    backend = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, prefill_chunk=64)
    backend.engine.min_share = 32
    steps = []

    def joining():
        steps.append(backend.engine.stats.prefill_tokens)
        return [(later, None)] if len(steps) == 2 else []  # after the first 64-token chunk

    out, st = run(backend, [first], joining)
    assert st.shared_tokens == 256
    assert st.prefill_tokens == len(first) + len(later) - 256
    assert out == [alone(backend, first), alone(backend, later)]


def test_a_prompt_that_continues_a_finished_answer_copies_its_rows(tiny_models):
    # A chat's next turn sent while the last answer's sequence still runs: the answer's
    # decoded rows serve too.
    g = torch.Generator().manual_seed(7)
    prompt = random_ids(150, g)
    backend = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, prefill_chunk=64)
    backend.engine.min_share = 32
    answer = alone(backend, prompt)
    follow = prompt + answer[:6] + random_ids(5, g)
    steps = []

    def joining():
        steps.append(1)
        return [(follow, None)] if len(steps) == 8 else []  # after 3 prefill and 4 decode steps

    out, st = run(backend, [prompt], joining)
    assert st.shared_tokens == 128  # the prompt's whole chunks (its answer's rows are no whole chunk)
    assert out == [answer, alone(backend, follow)]


# Quantized pages: rows depend on the chunks a prompt was prefilled in, so only the whole
# chunks before a prompt's last are copied, as the prefix store reads them back.
@pytest.mark.parametrize("kv_dtype,attention", [("int4", "topk"), ("int8", "window"), ("int8", "dense"),
                                                ("fp8", "topk")])
def test_quantized_pages_are_copied_by_whole_chunks_with_the_same_tokens(tiny_models, kv_dtype, attention):
    g = torch.Generator().manual_seed(11)
    document = random_ids(300, g)
    prompts = [document + random_ids(n, g) for n in (40, 52)]
    backend = NativeBackend.load(tiny_models["llama"], weights="fp32", kv_dtype=kv_dtype, attention=attention,
                                 block_size=16, prefill_chunk=64, kv_budget_bytes=16 << 20)
    backend.engine.min_share = 64
    scattered(backend)
    together, st = run(backend, prompts)
    assert st.shared_tokens == 256  # the document's whole chunks
    assert together == [alone(backend, p) for p in prompts]


def test_a_source_cut_short_by_a_mixed_step_is_not_waited_for(tiny_models):
    """Beside a streaming answer a prompt is prefilled in mixed steps, never in whole
    chunks again: requests waited for it, then read the document themselves, one behind
    another (probe 96)."""
    from ktcli.engine.sequence import Sequence

    g = torch.Generator().manual_seed(8)
    document = random_ids(300, g)
    backend = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, prefill_chunk=64)
    engine = backend.engine
    engine.min_share = 32
    source, later = (Sequence(i, document + random_ids(7, g), 307, 4) for i in (0, 1))
    for seq in (source, later):
        engine.blocks.grow(seq.block_table, seq.num_tokens)
    source.num_cached = source.aligned = 64  # one whole chunk so far: worth waiting for
    assert engine._share_prefixes([source, later]) == {later}
    source.num_cached = 64 + 16  # then a 16-token mixed step: no whole chunk will follow
    assert engine._share_prefixes([source, later]) == set() and later.num_cached == 64  # its one chunk, copied
