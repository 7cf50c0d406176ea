"""Write a tiny Hugging Face model folder as a GGUF file the way llama.cpp's converter
does (q/k rows permuted for the llama architecture, RoPE scaling as metadata keys or as a
`rope_freqs` tensor), with a 256-token byte-level tokenizer: rebuilding SmolLM2's 49K-token
vocabulary would cost the conversion tens of seconds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file


def _byte_tokens() -> list[str]:
    # GPT-2's byte-to-unicode table: every byte a printable character, so 256 tokens
    # spell any text and the vocabulary matches the tiny models' vocab_size of 256.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, n = dict.fromkeys(printable), 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + n
            n += 1
        elif chars[b] is None:
            chars[b] = b
    return [chr(chars[b]) for b in range(256)]


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's converter stores q/k rows of each head interleaved (pairs 2i, 2i+1)
    # instead of HF's halves; transformers' GGUF reader undoes this.
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(params: dict, head_dim: int) -> np.ndarray:
    """The divisors llama.cpp's converter writes as `rope_freqs.weight` for llama3 scaling."""
    base, factor = float(params["rope_theta"]), float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    orig = float(params["original_max_position_embeddings"])
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < orig / high:
            out.append(1.0)
        elif wavelen > orig / low:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(folder: Path, out: Path, *, rope_freqs: np.ndarray | None = None,
               metadata: dict | None = None, arch: str | None = None, quantize: tuple[str, ...] = (),
               pre: str = "default", tokens: dict[int, tuple[str, int]] | None = None, add_bos: bool = False,
               raw_metadata: dict | None = None, skip: tuple[str, ...] = ()) -> Path:
    """`folder`'s weights and shape as `out`; `rope_freqs`: the llama3 divisors tensor;
    `metadata`: extra `<arch>.` keys (rope.scaling.type, ...); `quantize`: ggml type names
    (Q4_1, Q8_0, ...) the matrices are stored as, in turn, as a mixed llama.cpp file has them;
    `pre`: the tokenizer's pre-tokenizer name (how llama.cpp says which text split it has);
    `tokens`: id -> (text, llama.cpp token type) in place of byte tokens; `add_bos`: the
    file says encodings start with BOS; `raw_metadata`: keys written as given ("split.count");
    `skip`: GGUF tensor names left out."""
    import gguf

    cfg = json.loads((folder / "config.json").read_text())
    arch = arch or cfg["model_type"]
    n_heads, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_heads
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name("tiny")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_rope_freq_base(float((cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(head_dim)
    if cfg.get("head_dim"):  # as llama.cpp's converter writes a head width of its own (Qwen3)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    for key, value in (metadata or {}).items():
        full = f"{arch}.{key}"
        if isinstance(value, str):
            w.add_string(full, value)
        elif isinstance(value, float):
            w.add_float32(full, value)
        else:
            w.add_uint32(full, int(value))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    vocab, types = _byte_tokens(), [1] * 256
    for i, (text, kind) in (tokens or {}).items():
        vocab[i], types[i] = text, kind
    w.add_token_list(vocab)
    w.add_token_types(types)
    if add_bos:
        w.add_add_bos_token(True)
    for key, value in (raw_metadata or {}).items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_uint32(key, int(value))
    w.add_token_scores([0.0] * 256)  # no merges: the reader then builds them from scores
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    n_matrices = 0
    for name, t in load_file(str(folder / "model.safetensors")).items():
        t = t.astype(np.float32)
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            _, _, layer, *rest = name.split(".")
            module, kind = ".".join(rest[:-1]), rest[-1]
            gname = f"blk.{layer}.{names[module]}.{kind}"
            if arch == "llama" and names[module] == "attn_q":
                t = _permute(t, n_heads)
            elif arch == "llama" and names[module] == "attn_k":
                t = _permute(t, n_kv)
        if gname in skip:
            continue
        if quantize and t.ndim == 2:
            qtype = gguf.GGMLQuantizationType[quantize[n_matrices % len(quantize)]]
            n_matrices += 1
            w.add_tensor(gname, np.asarray(gguf.quants.quantize(t, qtype)), raw_dtype=qtype)
        else:
            w.add_tensor(gname, t)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", np.asarray(rope_freqs, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
