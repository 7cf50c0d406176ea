"""Model shape, read from a Hugging Face config.json into one record (a GGUF file is
converted to such a folder first: `model_store`).

The engine never holds a transformers config object: everything the layers need is here,
so the forward pass reads plain attributes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ktcli.errors import UsageError

# Architectures the engine implements, by HF model_type. They differ only in flags below.
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_eps: float
    max_position: int
    rope: dict = field(default_factory=dict)  # rope_type, rope_theta, factor, ... (see rope.py)
    tie_embeddings: bool | None = False  # None: the config does not say (then a missing lm_head is tied)
    qkv_bias: bool = False  # Qwen2/2.5
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    # Per layer: None for full attention or the window in tokens (Mistral, Qwen sliding).
    sliding_windows: tuple[int | None, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def q_size(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    def kv_bytes_per_token(self, element_size: int) -> int:
        return 2 * self.n_layers * self.kv_size * element_size

    @property
    def window(self) -> int:
        """The context the model runs: `scaled_window` of its RoPE parameters."""
        return scaled_window(self.max_position, self.rope)


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def rope_params(cfg: dict) -> dict:
    """Normalise the two spellings: transformers 5 `rope_parameters` and the older
    `rope_theta` + `rope_scaling`."""
    params = dict(cfg.get("rope_parameters") or {})
    if "rope_theta" not in params:
        params["rope_theta"] = float(cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or {}
    for key, value in scaling.items():
        params.setdefault(key, value)
    kind = params.get("rope_type") or params.get("type") or "default"
    params["rope_type"] = kind
    params.pop("type", None)
    for key in ("partial_rotary_factor",):
        if key in cfg and key not in params:
            params[key] = cfg[key]
    # Values transformers fills in where a config leaves them out (a llama3 config without
    # its original window was an internal KeyError; yarn's "factor": null a TypeError).
    max_position = cfg.get("max_position_embeddings")
    if kind in ("llama3", "yarn", "longrope") and not params.get("original_max_position_embeddings") and max_position:
        params["original_max_position_embeddings"] = int(max_position)
    if kind == "yarn" and params.get("factor") is None:
        original = params.get("original_max_position_embeddings") or max_position or 1
        params["factor"] = float(max_position or original) / float(original)
    return params


ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")


def quantization_method(cfg: dict) -> str:
    """The checkpoint's quantization method ("fp8", "gptq", ...), or "" for float weights."""
    q = cfg.get("quantization_config") or cfg.get("text_config", {}).get("quantization_config")
    if not q:
        return ""
    return str(q.get("quant_method") or "unknown") if isinstance(q, dict) else "unknown"


def quantized_refusal(method: str) -> str:
    return (f"a {method}-quantized checkpoint: the ktcli engine reads float weights (fp32, bf16, fp16) and "
            "would read its codes as numbers; use --engine hf, or a dequantized copy of the model")


# The figures of a config.json (its text part) that size the model: whole numbers of at
# least 1, the optional ones where given. num_hidden_layers 0 was a ZeroDivisionError
# sizing the KV cache, max_position_embeddings -5 "the -5-token window is too small".
_SHAPE_REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size")
_SHAPE_OPTIONAL = ("num_key_value_heads", "head_dim", "max_position_embeddings", "intermediate_size", "vocab_size")


_SHAPE_MAX = 2**31  # past any model's figure; a larger one overflowed the readers below


def shape_problem(cfg: object) -> str | None:
    """What makes a config's shape impossible ("num_hidden_layers is 0, ..."), or None. A
    required figure that is missing is left to the reader's KeyError ("lacks ...")."""
    if not isinstance(cfg, dict):  # a list, or "text_config": null
        what = {type(None): "null", list: "list", str: "string", bool: "boolean"}.get(type(cfg), "number")
        return f"a JSON {what} where an object of settings belongs"
    for key in _SHAPE_REQUIRED + _SHAPE_OPTIONAL:
        value = cfg.get(key)
        if value is None:
            continue
        # (an int past a float's range made float() raise OverflowError: an internal error)
        whole = (isinstance(value, int) and not isinstance(value, bool)) or \
            (isinstance(value, float) and value.is_integer())
        if not whole or not 1 <= value <= _SHAPE_MAX:
            return f"{key} is {value!r}, not a whole number from 1 to {_SHAPE_MAX:,}"
    return None


def text_settings(cfg: object) -> object:
    """A config's language-model part: its `text_config` (multimodal releases) or itself."""
    return cfg.get("text_config", cfg) if isinstance(cfg, dict) else cfg


def from_hf_dict(cfg: dict) -> ModelConfig:
    # Its weights are codes with scales beside them (FP8 releases: weight_scale_inv): read
    # as floats, they loaded without a word and generated noise.
    method = quantization_method(cfg)
    if method:
        raise UsageError(quantized_refusal(method))
    cfg = cfg.get("text_config", cfg)
    model_type = cfg.get("model_type", "llama")
    if model_type not in SUPPORTED:
        raise UsageError(f"model type {model_type!r} is not supported by the ktcli engine (use --engine hf)")
    rope = rope_params(cfg)
    if rope["rope_type"] not in ROPE_TYPES:  # was an internal error at the first forward
        raise UsageError(f"RoPE type {rope['rope_type']!r} is not supported by the ktcli engine "
                         f"({', '.join(ROPE_TYPES)}; use --engine hf)")
    partial = float(rope.get("partial_rotary_factor", 1.0))
    if partial < 1:  # was an internal ValueError from the RoPE table, at load
        raise UsageError(f"partial rotary embeddings (partial_rotary_factor {partial:g}) are not supported by "
                         "the ktcli engine; --engine hf runs this model")
    n_heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    n_layers = int(cfg["num_hidden_layers"])
    head_dim = int(cfg.get("head_dim") or hidden // n_heads)

    windows = sliding_windows(cfg)

    default_bias = bool(cfg.get("attention_bias", False))
    return ModelConfig(
        model_type=model_type,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
        head_dim=head_dim,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position=int(cfg.get("max_position_embeddings", 2048)),
        rope=rope,
        tie_embeddings=None if cfg.get("tie_word_embeddings") is None else bool(cfg["tie_word_embeddings"]),
        # Qwen2 always has q/k/v biases; its config does not say so.
        qkv_bias=True if model_type == "qwen2" else default_bias,
        o_bias=default_bias if model_type != "qwen2" else False,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=model_type == "qwen3",
        sliding_windows=tuple(windows),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_ids(cfg.get("eos_token_id")),
    )


def load_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UsageError(f"{model_dir}: no config.json")
    cfg = json.loads(path.read_text())
    problem = shape_problem(text_settings(cfg))
    if problem:
        raise UsageError(f"{model_dir}: config.json is not a model config ({problem})")
    return from_hf_dict(cfg)


def scaled_window(max_position: int, rope: dict) -> int:
    """Context the RoPE parameters are good for: the trained window times the factor of a
    stretching scheme (linear, yarn, llama3, dynamic), as vLLM sizes it. A Qwen2.5 config
    with YaRN x4 was run and planned at its unscaled max_position_embeddings."""
    if rope.get("rope_type", "default") == "default":
        return max_position
    original = int(rope.get("original_max_position_embeddings") or max_position)
    return max(max_position, int(original * float(rope.get("factor", 1.0))))


SLIDING_WINDOW_REFUSAL = ("this model has sliding-window layers, which the paged KV cache does not take: "
                          "--kv-dtype fp8/int8/int4, --attention window/topk, --rope-scaling and --mode sparse "
                          "need a model without them")


def sliding_windows(cfg: dict) -> list[int | None]:
    """Per layer of a config.json (its text part): None for full attention or the window
    in tokens (Mistral, Qwen's use_sliding_window, per-layer `layer_types`)."""
    model_type = cfg.get("model_type", "llama")
    n_layers = int(cfg["num_hidden_layers"])
    layer_types = cfg.get("layer_types")
    window = cfg.get("sliding_window")
    if layer_types:
        return [int(window) if t == "sliding_attention" and window else None for t in layer_types]
    if model_type == "mistral" and window:
        return [int(window)] * n_layers
    if model_type in ("qwen2", "qwen3") and cfg.get("use_sliding_window") and window:
        first = int(cfg.get("max_window_layers", n_layers))
        return [int(window) if i >= first else None for i in range(n_layers)]
    return [None] * n_layers
