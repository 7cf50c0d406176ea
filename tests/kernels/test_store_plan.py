"""Store plans: one layer's plan serves every layer at the same staging state, and
applying it reads nothing back from the device."""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import reference as R
from kernels.store_plan import apply_store, plan_store
from tests.kernels.kernels_testutil import fill
from tests.kernels.test_kernels_reference import D, spec_of

KINDS = ["fp16", "fp8", "int8", "int4"]
STATE = ("k_pages", "v_pages", "k_min", "k_max", "k_scale", "v_scale", "v_zero", "k_bits", "stage_k", "stage_v",
         "stage_of_block", "block_of_stage")


def assert_same_layer(a: kernels.PagedKVLayer, b: kernels.PagedKVLayer) -> None:
    for name in STATE:
        x, y = getattr(a, name), getattr(b, name)
        if x is not None:
            assert torch.equal(x.nan_to_num(), y.nan_to_num()) if x.is_floating_point() else torch.equal(x, y), name


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_stage", [2, 8])
def test_a_plan_made_on_another_layer_stores_the_same(kind: str, n_stage: int) -> None:
    """Writes planned on a twin layer (given other values, as another layer of the model
    would be) and applied here leave exactly what kv_store leaves: prefill pieces and
    decode tokens of three sequences, and with 2 slots, chunks split into pieces."""
    spec = spec_of(kind, bs=8)
    twins: list[kernels.PagedKVLayer] = []

    def planned(layer, k, v, slots):
        if not twins:
            twins.append(kernels.allocate(spec, layer.num_blocks, n_stage=layer.n_stage))
            twins[0].k_weight = layer.k_weight
        plan = plan_store(twins[0], slots)
        apply_store(R.TORCH_OPS, twins[0], 3 * k, -v, plan)
        apply_store(R.TORCH_OPS, layer, k, v, plan)

    lens = [37, 5, 70] if n_stage == 8 else [70]
    expected = fill(spec, lens, seed=3, n_stage=n_stage)
    got = fill(spec, lens, seed=3, n_stage=n_stage, store=planned)
    assert_same_layer(expected.layer, got.layer)
    if n_stage == 2:
        assert got.layer.store_version == twins[0].store_version > 0


def test_one_piece_per_free_slot_run_and_one_upload() -> None:
    """A 40-token chunk over 5 pages with 2 free slots: pieces seal pages to free slots
    for the next ones; every field of every piece is a view of one device tensor."""
    layer = kernels.allocate(spec_of("int8", bs=8), 8, n_stage=2)
    plan = plan_store(layer, torch.arange(40))
    assert [(p.rows.start, p.rows.stop) for p in plan.pieces] == [(0, 16), (16, 32), (32, 40)]
    assert [p.sealed.tolist() for p in plan.pieces] == [[0, 1], [2, 3], [4]]
    storages = {t.untyped_storage().data_ptr() for p in plan.pieces for t in vars(p).values()
                if isinstance(t, torch.Tensor)}
    assert len(storages) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_applying_a_plan_reads_nothing_back(kind: str) -> None:
    """On the 'meta' device a tensor has no values, so any read of one (tolist, item,
    bool, nonzero, unique) raises: applying a plan there proves the per-layer work of a
    store never waits for the GPU. Quantized kinds: the write takes staging slots, fills
    and seals pages in three pieces and leaves one staged."""
    spec = spec_of(kind, bs=8)
    cpu = kernels.allocate(spec, 8, n_stage=2)
    R.kv_store(cpu, torch.randn(3, 2, D), torch.randn(3, 2, D), torch.arange(3))
    plan = plan_store(cpu, torch.arange(3, 35)).to("meta")
    assert len(plan.pieces) == (3 if spec.quantized else 1)
    meta = kernels.allocate(spec, 8, "meta", n_stage=2)
    meta.store_version = cpu.store_version
    apply_store(R.TORCH_OPS, meta, torch.randn(32, 2, D, device="meta"), torch.randn(32, 2, D, device="meta"), plan)
    assert meta.store_version == cpu.store_version + 1
    with pytest.raises(Exception):  # the check above means something: planning does read
        plan_store(meta, torch.arange(35, 40, device="meta"))


def test_a_plan_is_refused_at_another_staging_state() -> None:
    layer = kernels.allocate(spec_of("int4", bs=8), 4, n_stage=2)
    rows = torch.randn(3, 2, D)
    plan = plan_store(layer, torch.arange(3))
    apply_store(R.TORCH_OPS, layer, rows, rows, plan)
    with pytest.raises(RuntimeError, match="staging state"):
        apply_store(R.TORCH_OPS, layer, rows, rows, plan)  # a layer given the write twice
    stale = plan_store(layer, torch.arange(3, 6))
    kernels.release_blocks(layer, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="staging state"):
        apply_store(R.TORCH_OPS, layer, rows, rows, stale)  # planned before a release
    with pytest.raises(ValueError, match="3 rows"):
        apply_store(R.TORCH_OPS, layer, rows[:2], rows[:2], plan_store(layer, torch.arange(3, 6)))
    with pytest.raises(ValueError, match="outside the pool"):
        plan_store(layer, torch.tensor([32]))
