import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ktcli.engine.block_manager import BlockManager
from ktcli.errors import OutOfMemoryError


def test_allocate_covers_tokens_and_prefers_consecutive_pages():
    bm = BlockManager(num_blocks=10, block_size=4)
    table: list[int] = []
    bm.grow(table, 9)  # 3 pages
    assert table == [0, 1, 2]
    bm.grow(table, 12)  # still 3 pages
    assert table == [0, 1, 2]
    bm.grow(table, 13)
    assert table == [0, 1, 2, 3]
    assert bm.num_free == 6 and bm.num_used == 4


def test_exhaustion_raises_and_leaves_table_unchanged():
    bm = BlockManager(num_blocks=4, block_size=4)
    a: list[int] = []
    bm.grow(a, 12)
    b: list[int] = []
    with pytest.raises(OutOfMemoryError, match="KV cache full"):
        bm.grow(b, 8)
    assert b == [] and bm.num_free == 1
    assert not bm.can_grow(b, 8) and bm.can_grow(b, 4)


def test_reuse_after_free():
    bm = BlockManager(num_blocks=3, block_size=2)
    a: list[int] = []
    bm.grow(a, 6)
    bm.free(a)
    assert a == [] and bm.num_free == 3
    b: list[int] = []
    bm.grow(b, 6)
    assert sorted(b) == [0, 1, 2]


def test_double_free_is_refused():
    bm = BlockManager(num_blocks=3, block_size=2)
    a: list[int] = []
    bm.grow(a, 2)
    stale = list(a)
    bm.free(a)
    with pytest.raises(RuntimeError):
        bm.free(stale)


def test_interleaved_growth_falls_back_to_free_list():
    bm = BlockManager(num_blocks=6, block_size=1)
    a, b = [], []
    bm.grow(a, 1)
    bm.grow(b, 1)  # takes page 1, right after a's page
    bm.grow(a, 2)  # page 1 is taken: any free page
    assert len(set(a) | set(b)) == 3


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 8),
    st.integers(1, 40),
    st.lists(st.tuples(st.sampled_from(["grow", "free"]), st.integers(0, 4), st.integers(0, 30)), max_size=60),
)
def test_random_allocate_append_free(block_size, num_blocks, ops):
    bm = BlockManager(num_blocks, block_size)
    tables: dict[int, list[int]] = {i: [] for i in range(5)}
    lengths = {i: 0 for i in range(5)}
    for op, seq, amount in ops:
        if op == "grow":
            target = lengths[seq] + amount
            before = list(tables[seq])
            try:
                bm.grow(tables[seq], target)
                lengths[seq] = target
            except OutOfMemoryError:
                assert tables[seq] == before  # all or nothing
                assert bm.blocks_for(target) - len(before) > bm.num_free
        else:
            bm.free(tables[seq])
            lengths[seq] = 0
        owned = [b for t in tables.values() for b in t]
        assert len(owned) == len(set(owned)), "a page has two owners"
        assert len(owned) + bm.num_free == num_blocks
        assert all(not bm.is_free(b) for b in owned)
        for i, t in tables.items():
            assert len(t) == bm.blocks_for(lengths[i])
