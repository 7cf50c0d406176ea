"""The bit allocation that benchmarks.kv_key_ablation's allocated-key variants rest on."""

import itertools

import torch

from benchmarks.kv_key_ablation import allocate_bits, fake_keys, fake_keys_alloc


def test_allocation_spends_the_budget_and_is_optimal_on_a_small_case():
    span = torch.tensor([[0.01, 0.5, 3.0, 40.0]])
    widths = allocate_bits(span, mean_bits=4, max_bits=8)
    assert widths.sum().item() == 16 and widths.min() >= 0 and widths.max() <= 8

    def cost(w):
        return sum(s * s * 4.0 ** -b for s, b in zip(span[0].tolist(), w))

    best = min((w for w in itertools.product(range(9), repeat=4) if sum(w) == 16), key=cost)
    assert abs(cost(widths[0].tolist()) - cost(best)) < 1e-12 * cost(best)


def test_query_weight_moves_bits_to_the_channels_queries_use():
    span = torch.ones(1, 8)
    weight = torch.tensor([[100.0, 1, 1, 1, 1, 1, 1, 1]])
    plain, weighted = allocate_bits(span, 4, 8), allocate_bits(span, 4, 8, weight)
    assert plain[0].tolist() == [4] * 8
    assert weighted[0, 0] > 4 and weighted.sum() == 32


def test_allocated_keys_stay_inside_the_page_range_and_beat_uniform_on_skewed_channels():
    torch.manual_seed(0)
    k = torch.randn(64, 2, 16) * torch.logspace(-2, 1, 16)  # channel scales over three decades
    alloc, uniform = fake_keys_alloc(k, 4, 8), fake_keys(k, 4)
    assert (alloc >= k.amin(0) - 1e-6).all() and (alloc <= k.amax(0) + 1e-6).all()
    assert (alloc - k).square().mean() < 0.5 * (uniform - k).square().mean()
