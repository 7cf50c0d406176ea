import pytest
import torch

from ktcli.engine.rope import RotaryTable, interleave_permutation, inv_freq


def _hf(params: dict, seq_len=None, max_pos=4096, head_dim=64):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=max_pos, rope_parameters=dict(params))
    kind = params["rope_type"]
    if kind == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(cfg)
    return ROPE_INIT_FUNCTIONS[kind](cfg, "cpu", seq_len=seq_len)


CASES = [
    {"rope_type": "default", "rope_theta": 10000.0},
    {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 1024},
    {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 2.0, "original_max_position_embeddings": 2048,
     "beta_fast": 16, "beta_slow": 2, "mscale": 1.0, "mscale_all_dim": 0.5},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 3.0, "original_max_position_embeddings": 1024,
     "attention_factor": 1.5, "truncate": False},
]


@pytest.mark.parametrize("params", CASES, ids=lambda p: p["rope_type"])
def test_inv_freq_matches_transformers(params):
    ref, ref_factor = _hf(params)
    ours, factor = inv_freq(params, 64, 4096)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(ref_factor)


@pytest.mark.parametrize("seq_len", [100, 4096, 5000, 9000])
def test_dynamic_ntk_matches_transformers(seq_len):
    params = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    ref, _ = _hf(params, seq_len=seq_len)
    ours, _ = inv_freq(params, 64, 4096, seq_len)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)


def test_table_rotates_interleaved_pairs_like_rotate_half():
    """Our complex rotation on permuted dims equals HF's rotate-half on the original."""
    d = 16
    params = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
    table = RotaryTable(params, d, 256)
    pos = torch.tensor([0, 3, 200])
    x = torch.randn(3, d)
    freq, factor = inv_freq(params, d, 256)
    ang = torch.outer(pos.float(), freq)
    emb = torch.cat([ang, ang], -1)
    half = torch.cat([-x[:, d // 2 :], x[:, : d // 2]], -1)
    ref = x * emb.cos() * factor + half * emb.sin() * factor
    perm = interleave_permutation(d)
    rot = table.get(pos, 201)
    ours = torch.view_as_real(torch.view_as_complex(x[:, perm].reshape(3, d // 2, 2)) * rot).reshape(3, d)
    torch.testing.assert_close(ours, ref[:, perm], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("params", [
    {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": None, "original_max_position_embeddings": 1024},
], ids=["llama3-without-original", "yarn-factor-null"])
def test_values_a_config_leaves_out_are_filled_in_as_transformers_does(params):
    """A llama3 config without its original window was an internal KeyError, yarn's
    "factor": null a TypeError; transformers fills them in from the config."""
    from ktcli.engine.config import rope_params

    ours, factor = inv_freq(rope_params({"rope_parameters": dict(params), "max_position_embeddings": 4096}), 64, 4096)
    # transformers' own defaults: the original window is max_position_embeddings, and a
    # missing yarn factor is max_position_embeddings over the original window (4096 / 1024)
    filled = {"original_max_position_embeddings": 4096, **{k: v for k, v in params.items() if v is not None}}
    ref, ref_factor = _hf({"factor": 4.0, **filled} if params["rope_type"] == "yarn" else filled)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
    assert factor == pytest.approx(ref_factor)


def test_an_unknown_rope_type_is_refused_when_the_config_is_read():
    from ktcli.engine.config import from_hf_dict
    from ktcli.errors import UsageError

    cfg = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
           "intermediate_size": 128, "vocab_size": 256, "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}
    with pytest.raises(UsageError, match="RoPE type 'longrope' is not supported"):
        from_hf_dict(cfg)
