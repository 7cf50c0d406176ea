"""Measured throughput is remembered per engine and model, and sparse runs apart."""

from dataclasses import replace

from ktcli.config import Settings
from ktcli.pipeline.prepare import load_rates, save_rates
from ktcli.plan import Throughput


def test_sparse_runs_keep_their_own_rates(tmp_path):
    settings = replace(Settings(), cache_dir=str(tmp_path / "cache"))
    assert load_rates(settings) == Throughput()
    save_rates(settings, 300.0, 20.0)
    save_rates(settings, 180.0, 4.0, sparse=True)
    rates = load_rates(settings)
    assert (rates.prefill_tok_s, rates.decode_tok_s) == (300.0, 20.0)  # not dragged down by the sparse run
    assert (rates.sparse_prefill_tok_s, rates.sparse_decode_tok_s) == (180.0, 4.0)
    save_rates(settings, 100.0, 10.0)  # blended half and half; the sparse rates stay
    rates = load_rates(settings)
    assert (rates.prefill_tok_s, rates.decode_tok_s, rates.sparse_prefill_tok_s) == (200.0, 15.0, 180.0)
