"""Prompt K/V kept on disk (`engine.prefix_store`): a later prompt that starts the same way
reads those rows instead of prefilling them, and gets the tokens a full prefill gives."""

from dataclasses import replace

import pytest
import torch

from ktcli.engine.backend import SamplingParams
from ktcli.engine.native import NativeBackend
from ktcli.engine import prefix_store
from ktcli.engine.prefix_store import PrefixStore, prompt_cache_description

KEEP = SamplingParams(max_new_tokens=12, keep_prompt=True)


def rows(n, seed=0, layers=2, heads=2, dim=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(layers, n, heads, dim, generator=g), torch.randn(layers, n, heads, dim, generator=g)


def save(store, ids, k, v):
    return store.save(ids, lambda i: {"k": k[i], "v": v[i]}, k.shape[0])


def load(store, match, n):
    layers = list(store.layers(match, n))
    return torch.stack([a["k"] for a in layers]), torch.stack([a["v"] for a in layers])


def test_the_longest_shared_start_wins_and_reads_only_that_prefix(tmp_path):
    store = PrefixStore(tmp_path, "m", min_reuse=4)
    a, b = list(range(100, 140)), list(range(100, 120)) + list(range(500, 530))
    ka, va = rows(len(a), 1)
    save(store, a, ka, va)
    save(store, b, *rows(len(b), 2))
    m = store.longest(list(range(100, 135)) + [7, 8])
    assert m is not None and m.n_tokens == 35
    k, v = load(store, m, 35)
    assert torch.equal(k, ka[:, :35]) and torch.equal(v, va[:, :35])
    assert store.longest(list(range(100, 102)) + [1, 2, 3, 4]) is None  # 2 shared < min_reuse
    assert store.longest([9] * 50) is None


def test_least_recently_used_entries_go_when_the_store_is_full(tmp_path):
    import os

    k, v = rows(64)
    one = 2 * k.numel() * 4
    store = PrefixStore(tmp_path, "m", max_bytes=int(2.5 * one), min_reuse=4)
    for first, when in ((0, 1000), (1000, 2000)):  # the first entry is the older one
        before = set(store.folder.iterdir()) if store.folder.is_dir() else set()
        save(store, list(range(first, first + 64)), k, v)
        (new,) = set(store.folder.iterdir()) - before
        os.utime(new, (when, when))
    load(store, store.longest(list(range(0, 64))), 64)  # used now: newest
    save(store, list(range(2000, 2064)), k, v)  # a third entry: the least recently used goes
    assert store.longest(list(range(0, 64))) is not None
    assert store.longest(list(range(1000, 1064))) is None
    assert store.longest(list(range(2000, 2064))) is not None


def test_the_size_limit_bounds_every_key_folder_together(tmp_path):
    # Each weight or page dtype tried keeps its own key folder: the limit is for them all.
    k, v = rows(64)
    one = 2 * k.numel() * 4
    first, second = (PrefixStore(tmp_path, key, max_bytes=int(2.5 * one), min_reuse=4) for key in ("m1", "m2"))
    save(first, list(range(0, 64)), k, v)
    save(first, list(range(100, 164)), k, v)
    save(second, list(range(200, 264)), k, v)  # a third entry, in another folder
    held = sorted(p.name for p in tmp_path.rglob("*.kv"))
    assert len(held) == 2 and second.longest(list(range(200, 264))) is not None


def test_a_damaged_entry_counts_as_none(tmp_path):
    store = PrefixStore(tmp_path, "m", min_reuse=4)
    save(store, list(range(40)), *rows(40))
    (entry,) = store.folder.iterdir()
    whole = entry.read_bytes()
    match = store.longest(list(range(40)))
    entry.write_bytes(whole[:-100])  # rows cut short after the lookup: their read fails
    with pytest.raises(ValueError):
        load(store, match, 40)
    assert store.longest(list(range(40))) is None  # and the next lookup finds no entry
    entry.write_bytes(whole[:60])  # the header cut short: no entry
    assert store.longest(list(range(40))) is None


def test_a_header_with_a_flipped_bit_counts_as_none(tmp_path):
    """`"float36"` was an internal error (getattr(torch, ...)) on every run."""
    store = PrefixStore(tmp_path, "m", min_reuse=4)
    save(store, list(range(40)), *rows(40))
    (entry,) = [p for p in store.folder.iterdir() if p.suffix == ".kv"]
    for good, bad in ((b"float32", b"float36"), (b'"shape": [2', b'"shape": ["x"'), (b'"items": 40', b'"items": 41'),
                      (b'"unit": 1', b'"unit": 3'), (b'"tokens": 40', b'"tokens": 20'),  # rows of other tokens
                      (b'"tokens": 40', b'"tokens": 4000000000000'), (b'"tokens": 40', b'"tokens": 1e400')):
        whole = entry.read_bytes()
        entry.write_bytes(whole.replace(good, bad, 1))
        assert store.longest(list(range(40))) is None
        entry.write_bytes(whole)
    assert store.longest(list(range(40))) is not None


def test_a_folder_that_cannot_be_looked_into_is_no_entry(tmp_path, monkeypatch):
    from pathlib import Path

    store = PrefixStore(tmp_path, "m", min_reuse=4)
    monkeypatch.setattr(Path, "is_dir", lambda self: (_ for _ in ()).throw(PermissionError(13, "denied")))
    assert store.longest(list(range(40))) is None  # was "internal error: PermissionError"


def test_temp_files_of_killed_runs_are_swept_when_old(tmp_path):
    import os
    import time

    store = PrefixStore(tmp_path, "m", min_reuse=4)
    store.folder.mkdir(parents=True)
    old, fresh = store.folder / "abc.kv.123.tmp", store.folder / "def.kv.456.tmp"
    for p in (old, fresh):
        p.write_bytes(b"x" * 100)
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    save(store, list(range(40)), *rows(40))
    assert not old.exists() and fresh.exists()  # one being written now stays


def test_old_temp_files_of_other_key_folders_are_swept_too(tmp_path):
    """Only the folder written to was swept: a killed run's file under another model's or
    dtype's key, uncounted by MAX_BYTES, stayed until a run of that key kept an entry."""
    import os
    import time

    other = tmp_path / "other-key"
    other.mkdir()
    old, fresh = other / "abc.kv.123.tmp", other / "def.kv.456.tmp"
    for p in (old, fresh):
        p.write_bytes(b"x" * 100)
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    save(PrefixStore(tmp_path, "m", min_reuse=4), list(range(40)), *rows(40))
    assert not old.exists() and fresh.exists()


def test_an_unwritable_store_is_skipped(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    store = PrefixStore(tmp_path / "file", "m")
    assert save(store, list(range(40)), *rows(40)) is False
    assert store.longest(list(range(200))) is None


def test_a_read_only_store_is_still_read(tmp_path, monkeypatch):
    import os

    store = PrefixStore(tmp_path, "m", min_reuse=4, described={"model": "x"})
    k, v = rows(40)
    save(store, list(range(40)), k, v)
    (store.folder / "key.json").unlink()  # kept before descriptions were

    def refused(*a, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "utime", refused)
    monkeypatch.setattr(type(store.folder), "write_text", refused)
    got_k, got_v = load(store, store.longest(list(range(40))), 40)  # utime and the description fail
    assert torch.equal(got_k, k) and torch.equal(got_v, v)


@pytest.mark.parametrize("damage", ["", '{"model": "Smol', "[1, 2]"])
def test_a_damaged_description_is_written_again(tmp_path, damage):
    """key.json was written in place and rewritten only where empty: one cut short kept
    `stored_prefixes` (the plan) from counting the folder's rows on every later run."""
    wanted = {"model": "x", "weights": "int8", "kv_dtype": "fp16", "device": "cpu"}
    store = PrefixStore(tmp_path, "m", min_reuse=4, described=dict(wanted, attention="dense"))
    ids = list(range(40))
    save(store, ids, *rows(40))
    (store.folder / "key.json").write_text(damage)
    assert prefix_store.stored_prefixes(tmp_path, ids + [1], wanted, min_reuse=4) == {}
    list(store.layers(store.longest(ids), 40))  # a run reads the rows back
    assert prefix_store.stored_prefixes(tmp_path, ids + [1], wanted, min_reuse=4) == {("fp16", "dense"): 40}
    assert [p.name for p in store.folder.iterdir() if not p.name.endswith(".kv")] == ["key.json"]


def test_a_nearly_full_disk_makes_room_from_old_entries_first(tmp_path, monkeypatch):
    import os
    import shutil

    k, v = rows(64)
    store = PrefixStore(tmp_path, "m", min_reuse=4)
    for first, when in ((0, 1000), (1000, 2000)):
        save(store, list(range(first, first + 64)), k, v)
        os.utime(store.longest(list(range(first, first + 64))).path, (when, when))
    real = shutil.disk_usage
    size = next(store.folder.glob("*.kv")).stat().st_size

    def disk(path):  # a disk with room for 2.5 entries beside the margin the store leaves free
        held = sum(p.stat().st_size for p in tmp_path.rglob("*.kv"))
        return real(path)._replace(free=prefix_store.FREE_DISK_KEPT + int(2.5 * size) - held)

    monkeypatch.setattr(shutil, "disk_usage", disk)
    assert save(store, list(range(2000, 2064)), k, v)  # the oldest entry made way
    assert store.longest(list(range(0, 64))) is None and store.longest(list(range(1000, 1064))) is not None
    assert store.longest(list(range(2000, 2064))) is not None

    monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=1000))
    assert not save(store, list(range(3000, 3064)), k, v)
    assert "MiB free on the disk" in store.last_error
    # no room even without every entry: none is removed for nothing
    assert store.longest(list(range(1000, 1064))) is not None and store.longest(list(range(2000, 2064))) is not None
    assert not list(store.folder.glob("*.tmp"))


def test_a_full_disk_is_said_and_an_interrupted_write_leaves_no_temp_file(tmp_path, monkeypatch):
    import errno

    store = PrefixStore(tmp_path, "m", min_reuse=4)
    k, v = rows(40)

    def full(i):
        if i == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return {"k": k[i], "v": v[i]}

    assert not store.save(list(range(40)), full, 2)
    assert store.last_error == "No space left on device"
    assert not list(store.folder.iterdir())

    def interrupted(i):
        if i == 1:
            raise KeyboardInterrupt
        return {"k": k[i], "v": v[i]}

    with pytest.raises(KeyboardInterrupt):
        store.save(list(range(40)), interrupted, 2)
    assert not list(store.folder.iterdir())
    assert save(store, list(range(40)), k, v) and store.last_error is None


def generate(backend, prompt, params):
    out = []
    for _, tok in backend.engine.generate([prompt], params, frozenset()):
        out.append(tok)
    return out, backend.engine.stats


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen3"])
def test_reused_rows_give_the_tokens_of_a_full_prefill(tiny_models, tmp_path, kind):
    folder = tiny_models[kind]
    g = torch.Generator().manual_seed(5)
    document = torch.randint(0, 256, (150,), generator=g).tolist()
    questions = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 14)]
    plain = NativeBackend.load(folder, weights="fp32", block_size=4, prefill_chunk=64)
    cached = NativeBackend.load(folder, weights="fp32", block_size=4, prefill_chunk=64, prefix_cache=tmp_path)
    cached.engine.prefix.min_tokens = cached.engine.prefix.min_reuse = 32
    # Pages taken out of order, so the reused rows go through a slot index, not one run.
    hold = [[] for _ in range(6)]
    for t in hold:
        cached.engine.blocks.grow(t, 8)
    for t in hold[::2]:
        cached.engine.blocks.free(t)

    first, st = generate(cached, document + questions[0], KEEP)
    assert st.kept_tokens == 159 and st.reused_tokens == 0
    assert first == generate(plain, document + questions[0], KEEP)[0]
    second, st = generate(cached, document + questions[1], KEEP)
    assert st.reused_tokens == 150 and st.kept_tokens == 0  # 14 new tokens: not worth an entry
    assert second == generate(plain, document + questions[1], KEEP)[0]
    again, st = generate(cached, document + questions[0], KEEP)
    assert st.reused_tokens == 158  # all but the last prompt token, whose logits are needed
    assert again == first


def test_nothing_is_kept_unless_asked_and_other_settings_read_nothing(tiny_models, tmp_path):
    folder = tiny_models["llama"]
    prompt = list(range(1, 200))
    b = NativeBackend.load(folder, weights="fp32", block_size=4, prefix_cache=tmp_path)
    b.engine.prefix.min_tokens = b.engine.prefix.min_reuse = 32
    generate(b, prompt, replace(KEEP, keep_prompt=False))
    assert not any(tmp_path.rglob("*.kv"))
    generate(b, prompt, KEEP)
    assert b.engine.stats.kept_tokens == len(prompt)
    # bf16 weights compute other rows: a store of their own
    other = NativeBackend.load(folder, weights="bf16", block_size=4, prefix_cache=tmp_path)
    other.engine.prefix.min_reuse = 32
    generate(other, prompt, KEEP)
    assert other.engine.stats.reused_tokens == 0


def test_a_streamed_prompt_is_kept_when_the_caller_is_done_not_before(tiny_models, tmp_path):
    """The CLI shows the answer's sources before the entry is written (`finish`)."""
    b = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, prefix_cache=tmp_path)
    b.engine.prefix.min_tokens = b.engine.prefix.min_reuse = 32
    b._decode = lambda ids: "".join(f"<{i}>" for i in ids)  # a tiny model has no tokenizer
    prompt = list(range(1, 200))
    text = "".join(b.stream_ids(prompt, KEEP))
    assert not any(tmp_path.rglob("*.kv")) and b.engine.blocks.num_used > 0  # its pages held for the entry
    assert b.finish() is None
    assert b.last_stats.extra["kept_tokens"] > 0 and b.engine.blocks.num_used == 0
    assert len(list(tmp_path.rglob("*.kv"))) == 1
    assert "".join(b.stream_ids(prompt, KEEP)) == text and b.last_stats.extra["reused_tokens"] > 0

    # One never finished is written by the next run, before its own prompt looks for entries.
    other = list(range(255, 55, -1))
    list(b.stream_ids(other, KEEP))
    list(b.stream_ids(other, KEEP))
    assert b.last_stats.extra["reused_tokens"] > 0 and len(list(tmp_path.rglob("*.kv"))) == 2


def test_a_prompt_the_disk_refuses_is_said_by_finish(tiny_models, tmp_path, monkeypatch):
    import shutil

    b = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, prefix_cache=tmp_path)
    b.engine.prefix.min_tokens = b.engine.prefix.min_reuse = 32
    b._decode = lambda ids: "".join(f"<{i}>" for i in ids)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    list(b.stream_ids(list(range(1, 200)), KEEP))
    warning = b.finish()
    assert warning.startswith("the prompt cache could not keep this prompt") and "MiB free" in warning
    assert b.engine.blocks.num_used == 0 and "kept_tokens" not in b.last_stats.extra
    # said once: the next run, with room again, says nothing of it
    monkeypatch.setattr(shutil, "disk_usage", real)
    list(b.stream_ids(list(range(1, 200)), KEEP))
    assert b.finish() is None
    # one refused while the next run writes it (no finish between) is said by that run's finish
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 1000))
    list(b.stream_ids(list(range(2, 200)), KEEP))
    list(b.stream_ids(list(range(3, 20)), KEEP))  # too short to keep: only the earlier one's write
    assert "MiB free" in (b.finish() or "")


def test_reused_rows_land_in_the_slots_of_their_positions(tiny_models, tmp_path):
    """Token t's stored rows go to the slot its block table gives t, pages out of order."""
    from ktcli.engine.sequence import Sequence

    b = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, prefix_cache=tmp_path)
    store = b.engine.prefix
    store.min_reuse = 8
    kv = b.kv
    layers, heads, dim = len(kv.k), kv.n_kv_heads, kv.head_dim
    k, v = rows(30, 7, layers, heads, dim)
    save(store, list(range(30)), k, v)
    s = Sequence(0, list(range(30)) + [99, 98], 32, 4)
    s.block_table = [9, 2, 14, 3, 7, 11, 5, 0]  # as a busy cache hands pages out
    b.engine._reuse_prefix(s)
    assert s.num_cached == s.reused == 30
    for t in range(30):
        slot = s.block_table[t // 4] * 4 + t % 4
        for layer in range(layers):
            assert torch.equal(kv.k[layer][slot], k[layer, t]) and torch.equal(kv.v[layer][slot], v[layer, t])


def test_the_prompt_cache_setting_turns_the_store_on_and_off(tmp_path):
    from ktcli.config import Settings
    from ktcli.engine.loading import load_backend
    from tests.cli.conftest import fresh_cache

    settings = replace(Settings(), cache_dir=str(fresh_cache(tmp_path)), device="cpu")
    assert load_backend(settings).engine.prefix.folder.parent == tmp_path / "cache" / "prompts"
    assert load_backend(replace(settings, prompt_cache=False)).engine.prefix is None


def test_a_damaged_entry_is_prefilled_whole(tiny_models, tmp_path):
    folder = tiny_models["llama"]
    prompt = list(range(3, 120))
    b = NativeBackend.load(folder, weights="fp32", block_size=4, prefix_cache=tmp_path)
    b.engine.prefix.min_tokens = b.engine.prefix.min_reuse = 32
    want, _ = generate(b, prompt, KEEP)
    (entry,) = b.engine.prefix.folder.glob("*.kv")
    entry.write_bytes(entry.read_bytes()[:-4096])  # rows the prefix needs are missing
    got, st = generate(b, prompt, KEEP)
    assert got == want and st.reused_tokens == 0


def test_the_plan_counts_a_cached_prompt_as_read_not_prefilled(tmp_path):
    """prepare() finds how much of this question's whole-read prompt the store holds."""
    from ktcli.config import Settings
    from ktcli.engine.model_store import ensure_hf_dir, resolve_model
    from ktcli.engine.tokenizer import load_chat_tokenizer
    from ktcli.pipeline import prompts
    from ktcli.pipeline.events import NullReporter
    from ktcli.pipeline.prepare import prepare
    from tests.cli.conftest import PDF, fresh_cache

    settings = replace(Settings(), cache_dir=str(fresh_cache(tmp_path)), device="cpu")
    first = prepare([str(PDF)], "Who is the chair?", "ask", settings, NullReporter())
    assert first.plan.cached_tokens == 0  # nothing stored yet
    tok = load_chat_tokenizer(ensure_hf_dir(resolve_model("smollm2"), settings.cache_path))
    ids = tok.apply_chat_template(prompts.ask_messages("Who is the chair?", prompts.whole_input(first.corpus.documents)))
    folder = ensure_hf_dir(resolve_model("smollm2"), settings.cache_path)
    # Rows of other settings, or a folder without a description, are not counted: the run
    # would not read them.
    for key, described in (("undescribed", None),
                           ("fp32", prompt_cache_description(folder, "fp32", "fp32", "cpu"))):
        save(PrefixStore(settings.cache_path / "prompts", key, described=described), ids, *rows(len(ids)))
    assert prepare([str(PDF)], "Who is the chair?", "ask", settings, NullReporter()).plan.cached_tokens == 0
    assert prepare([str(PDF)], "Who is the chair?", "ask", replace(settings, weights="fp32"),
                   NullReporter()).plan.cached_tokens == len(ids) - 1
    store = PrefixStore(settings.cache_path / "prompts", "somekey",
                        described=prompt_cache_description(folder, "int8", "fp16", "cpu"))  # the CPU defaults
    save(store, ids, *rows(len(ids)))
    again = prepare([str(PDF)], "Who is the chair?", "ask", settings, NullReporter())
    other = prepare([str(PDF)], "What was net income?", "ask", settings, NullReporter())
    assert again.plan.cached_tokens == len(ids) - 1
    assert 0 < other.plan.cached_tokens < len(ids) - 1  # the document, not the question
    assert again.plan.est_seconds < first.plan.est_seconds
    off = prepare([str(PDF)], "Who is the chair?", "ask", replace(settings, prompt_cache=False), NullReporter())
    assert off.plan.cached_tokens == 0


# Quantized pages: a row depends on the chunks its prompt was prefilled in, so an entry
# keeps the whole chunks before the prompt's last (pages, scales, summaries, exact sinks).
@pytest.mark.parametrize("kv_dtype,attention,kept", [("int4", "topk", 256), ("int8", "window", 320),
                                                     ("int8", "dense", 320), ("fp8", "topk", 256)])
def test_reused_pages_give_the_tokens_of_a_fresh_prefill(tiny_models, tmp_path, kv_dtype, attention, kept):
    folder = tiny_models["llama"]
    g = torch.Generator().manual_seed(11)
    document = torch.randint(0, 256, (300,), generator=g).tolist()
    questions = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (40, 52)]
    opts = dict(weights="fp32", kv_dtype=kv_dtype, attention=attention, block_size=16, prefill_chunk=64,
                kv_budget_bytes=16 << 20)
    plain = NativeBackend.load(folder, **opts)
    cached = NativeBackend.load(folder, **opts, prefix_cache=tmp_path)
    cached.engine.prefix.min_reuse, cached.engine.prefix.min_tokens = 64, 128
    hold = [[] for _ in range(6)]  # pages handed out of order, as in a busy cache
    for t in hold:
        cached.engine.blocks.grow(t, 32)
    for t in hold[::2]:
        cached.engine.blocks.free(t)

    # 340 tokens: chunks of 64 up to 256, then (topk) 52 + 32 so the question's last
    # queries share one chunk, or (no question pages) 64 + 20.
    first, st = generate(cached, document + questions[0], KEEP)
    assert st.kept_tokens == kept and st.reused_tokens == 0
    assert first == generate(plain, document + questions[0], KEEP)[0]
    second, st = generate(cached, document + questions[1], KEEP)
    assert st.reused_tokens == 256 and st.kept_tokens == 0  # the document's whole chunks; 64 new: no entry
    assert second == generate(plain, document + questions[1], KEEP)[0]
    again, st = generate(cached, document + questions[0], KEEP)
    assert st.reused_tokens == kept and again == first


def test_a_new_question_about_a_held_document_writes_no_copy_of_its_pages(tiny_models, tmp_path):
    """A sparse read keeps whole chunks, the last of them holding the question's first
    words: measured against what it could read back (the chunks before), every question
    was worth an entry of its own, a copy of the document's pages (5 questions about a
    12K-token document: five 158 MB entries). Measured against what the store holds, it
    adds a chunk's part of a question: no entry; the document's pages are read back all
    the same."""
    folder = tiny_models["llama"]
    g = torch.Generator().manual_seed(12)
    document = torch.randint(0, 256, (300,), generator=g).tolist()
    questions = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (40, 52)]
    cached = NativeBackend.load(folder, weights="fp32", kv_dtype="int8", attention="window", block_size=16,
                                prefill_chunk=64, kv_budget_bytes=16 << 20, prefix_cache=tmp_path)
    cached.engine.prefix.min_reuse, cached.engine.prefix.min_tokens = 64, 64  # an entry's worth: one chunk
    _, st = generate(cached, document + questions[0], KEEP)
    assert st.kept_tokens == 320
    _, st = generate(cached, document + questions[1], KEEP)
    assert st.reused_tokens == 256 and st.kept_tokens == 0  # 64 new to this run, 20 to the store
    assert len(list(cached.engine.prefix.folder.glob("*.kv"))) == 1
    longer = document + torch.randint(0, 256, (100,), generator=g).tolist()  # the document grew: new pages
    _, st = generate(cached, longer + questions[0], KEEP)
    assert st.kept_tokens > 320


def test_pages_of_other_settings_are_not_read(tiny_models, tmp_path):
    folder = tiny_models["llama"]
    prompt = torch.randint(0, 256, (299,), generator=torch.Generator().manual_seed(3)).tolist()
    opts = dict(weights="fp32", block_size=16, prefill_chunk=64, kv_budget_bytes=16 << 20, prefix_cache=tmp_path)
    stores = set()
    for kw in (dict(kv_dtype="int4", attention="topk"), dict(kv_dtype="int8", attention="topk"),
               dict(kv_dtype="int4", attention="window"), dict(kv_dtype="int4", attention="topk", prefill_chunk=128),
               dict(kv_dtype="int4", attention="topk", rope_scaling="linear:2")):
        b = NativeBackend.load(folder, **{**opts, **kw})
        b.engine.prefix.min_tokens = b.engine.prefix.min_reuse = 64
        generate(b, prompt, KEEP)
        assert b.engine.stats.reused_tokens == 0 and b.engine.stats.kept_tokens > 0
        stores.add(b.engine.prefix.folder)
    assert len(stores) == 5
    served = NativeBackend.load(folder, **opts, kv_dtype="int4", attention="topk", kv_windows=4)  # staging differs
    served.engine.prefix.min_reuse = 64
    generate(served, prompt, KEEP)
    assert served.engine.stats.reused_tokens > 0


def test_a_damaged_page_entry_is_prefilled_whole(tiny_models, tmp_path):
    folder = tiny_models["llama"]
    prompt = torch.randint(0, 256, (330,), generator=torch.Generator().manual_seed(4)).tolist()
    b = NativeBackend.load(folder, weights="fp32", kv_dtype="int4", attention="topk", block_size=16, prefill_chunk=64,
                           kv_budget_bytes=16 << 20, prefix_cache=tmp_path)
    b.engine.prefix.min_tokens = b.engine.prefix.min_reuse = 64
    want, _ = generate(b, prompt, KEEP)
    (entry,) = b.engine.prefix.folder.glob("*.kv")
    whole = entry.read_bytes()
    entry.write_bytes(whole[:-4096])
    got, st = generate(b, prompt, KEEP)
    assert got == want and st.reused_tokens == 0
    # bytes damaged in place, in the middle of the pages: the size is right, the checksum
    # is not (a sparse read answered nothing, question after question)
    middle = len(whole) // 2
    entry.write_bytes(whole[:middle] + bytes(b ^ 0x5A for b in whole[middle : middle + 4096]) + whole[middle + 4096:])
    got, st = generate(b, prompt, KEEP)
    assert got == want and st.reused_tokens == 0 and st.kept_tokens > 0  # read whole, and kept afresh
    got, st = generate(b, prompt, KEEP)
    assert got == want and st.reused_tokens > 0


def test_the_plan_counts_a_sparse_reads_pages_and_prefers_their_kind(tmp_path):
    """An input far past the window: its count needs the model's tokenizer only when the
    store holds pages in whole chunks, and the chunks a run would read are counted."""
    from ktcli.config import Settings
    from ktcli.engine.model_store import ensure_hf_dir, resolve_model
    from ktcli.engine.prefix_store import whole_chunks
    from ktcli.engine.tokenizer import load_chat_tokenizer
    from ktcli.pipeline import prompts
    from ktcli.pipeline.events import NullReporter
    from ktcli.pipeline.prepare import prepare
    from tests.cli.conftest import SAMPLES, fresh_cache

    doc = tmp_path / "tutorial-part.rst"
    lines = (SAMPLES / "python-tutorial-3.11.rst").read_text(encoding="utf-8").split("\n")[:1450]
    doc.write_text("\n".join(lines), encoding="utf-8")
    question = "What does the pass statement do?"
    settings = replace(Settings(), cache_dir=str(fresh_cache(tmp_path)), device="cpu", mode="sparse")
    first = prepare([str(doc)], question, "ask", settings, NullReporter())
    assert first.plan.cached_tokens == 0 and first.plan.kv_dtype == "int8"  # the preferred kind

    folder = ensure_hf_dir(resolve_model("smollm2"), settings.cache_path)
    ids = load_chat_tokenizer(folder).apply_chat_template(
        prompts.ask_messages(question, prompts.whole_input(first.corpus.documents)), add_generation_prompt=True)
    held = (len(ids) - 100) // 64 * 64  # an earlier question's whole chunks, of int4 topk pages
    store = PrefixStore(settings.cache_path / "prompts", "int4-topk", described=prompt_cache_description(
        folder, "int8", "int4", "cpu", "topk:8", 512, 32))
    assert store.save(ids[:held], lambda i: {"k_pages": torch.zeros(held // 64, 2)}, 2, unit=64)
    again = prepare([str(doc)], question, "ask", settings, NullReporter())
    assert again.plan.kv_dtype == "int4" and again.plan.attention == "topk"
    assert again.plan.cached_tokens == whole_chunks(held, len(ids), 512, 32) > 0
    assert again.plan.est_seconds < first.plan.est_seconds / 2
    auto = prepare([str(doc)], question, "ask", replace(settings, mode="auto"), NullReporter())
    assert auto.plan.mode.value == "retrieval"  # auto does not switch to sparse, but says it is quick now
    assert any("int4 topk pages are in the prompt cache" in r for r in auto.plan.reasons)
    # the same policy spelled out reads them; another RoPE scaling would not
    spelled = prepare([str(doc)], question, "ask", replace(settings, attention="topk:8"), NullReporter())
    assert spelled.plan.cached_tokens == again.plan.cached_tokens
    scaled = prepare([str(doc)], question, "ask", replace(settings, rope_scaling="linear:2"), NullReporter())
    assert scaled.plan.cached_tokens == 0

    # a few shared chunks are not worth another kind of pages
    for entry in store.folder.glob("*.kv"):
        entry.unlink()
    assert store.save(ids[:1024], lambda i: {"k_pages": torch.zeros(16, 2)}, 2, unit=64)
    few = prepare([str(doc)], question, "ask", settings, NullReporter())
    assert few.plan.kv_dtype == "int8" and few.plan.cached_tokens == 0



def test_a_chunk_that_is_not_whole_pages_keeps_nothing_and_fails_nothing(tiny_models, tmp_path):
    """prefill_chunk 40 over 16-token pages: the kept prefix was no whole pages and the
    save raised out of generate (API callers; the CLI's 512 / 64 never do)."""
    b = NativeBackend.load(tiny_models["llama"], weights="fp32", kv_dtype="int8", attention="topk", block_size=16,
                           prefill_chunk=40, kv_budget_bytes=16 << 20, prefix_cache=tmp_path)
    b.engine.prefix.min_tokens = b.engine.prefix.min_reuse = 16
    prompt = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(8)).tolist()
    first, _ = generate(b, prompt, KEEP)
    again, st = generate(b, prompt, KEEP)
    assert again == first and st.reused_tokens == 0


def test_outputs_are_named_by_the_prompt_stores_key(tiny_models, tmp_path):
    """`pipeline.notes_memo` keeps a summary's notes under the backend's `outputs_key`: the
    same for the same model and settings, another for other weights or pages, none without
    a prompt store (the prompt cache off keeps what was read off the disk)."""
    folder = tiny_models["llama"]
    named = [NativeBackend.load(folder, weights=w, block_size=4, prefix_cache=tmp_path, **kw).outputs_key
             for w, kw in (("fp32", {}), ("fp32", {}), ("bf16", {}), ("fp32", dict(kv_dtype="int8")))]
    assert named[0] == named[1] and len(set(named)) == 3 and all(named)
    assert NativeBackend.load(folder, weights="fp32", block_size=4).outputs_key is None
