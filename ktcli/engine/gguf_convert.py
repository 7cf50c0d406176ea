"""A GGUF file as a Hugging Face model folder, written by ktcli itself: config.json,
generation_config.json, tokenizer.json, tokenizer_config.json and chat_template.jinja, the
files transformers' GGUF loader and `save_pretrained` wrote. The weights stay in the GGUF,
dequantized as they are read (`gguf_weights`); `write_safetensors` writes them as the
float32 model.safetensors that loader wrote, for readers that need the file.

Why: that loader took ~50 s of a first run here for the bundled 135M model (its metadata
reader walked the 98K tokenizer strings three times, a tensor-name table was rebuilt for
each of 397 names, and the tokenizer was built through transformers' classes), and held the
whole model in memory as float32 while saving it. This reads the header once, dequantizes
one tensor at a time (`gguf_dequant`) as it is read, and builds the tokenizer with the
`tokenizers` library: a few seconds (`python -m benchmarks.gguf_convert`).

What it writes is what transformers wrote for the same file: the same weights bit for bit,
the same tokenizer.json, a config that loads to the same values. It takes llama, qwen2 and
qwen3 files with a byte-level BPE tokenizer (llama.cpp's "gpt2" model) and the tensor types
`gguf_dequant` reads; anything else raises `Unsupported` and the caller falls back to
transformers' loader (`model_store._convert_gguf`).

Where it differs on purpose: a GGUF whose vocabulary lacks `<|endoftext|>` got it from
transformers' GPT-2 tokenizer class as an extra token past the model's vocabulary (an id
the embedding has no row for); it is not added here. Control tokens written outside the
byte alphabet (DeepSeek's "<｜User｜>") are special tokens at their own ids here; there they
were not, and the BOS and EOS among them got ids past the embedding. A file whose tensors
disagree with its metadata, or lack a layer's, is refused (`Inconsistent`), not converted.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ktcli.engine import gguf_dequant
from ktcli.engine.gguf_header import GGUFHeader, Tensor
from ktcli.engine.safetensors_header import write_file

# The arrays the tokenizer needs whole (`gguf_header.read_header(path, whole=...)`).
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")

_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# tokenizer_config.json's class, as transformers wrote it for each architecture
_TOKENIZER_CLASSES = {"llama": "TokenizersBackend", "qwen2": "Qwen2Tokenizer", "qwen3": "Qwen2Tokenizer"}

# GGUF module names (blk.N.<name>.weight) -> the Hugging Face ones (model.layers.N.<name>.weight)
_LAYER_MODULES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_LEVEL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
# Not weights: llama3 RoPE scaling's divisors, which `gguf_meta.rope_scaling` turns into config.
_NOT_WEIGHTS = ("rope_freqs.weight",)

# The text splits llama.cpp names by `tokenizer.ggml.pre` that differ from GPT-2's; each is
# the published pre-tokenizer pattern of its model family. Files that name no split of
# these, or one of GPT-2's ("default", "gpt2", SmolLM's "smollm"), are split as GPT-2 splits
# (transformers' reading of them); any other name is left to transformers' loader.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
           "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
_GPT2_SPLIT = (None, "default", "gpt2", "smollm")

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types
# A vocabulary with no merges is taken only this small: its tokens single characters (the
# tests' byte vocabularies); a real one without merges needs them made from its scores.
_MERGELESS_MAX_TOKENS = 512


class Unsupported(Exception):
    """A GGUF this converter does not write; transformers' loader may."""


class Inconsistent(ValueError):
    """A GGUF whose tensors disagree with its own metadata: no converter makes a model of it."""


# The tensors every layer has (norms, attention, MLP); biases and q/k norms are some models'.
_REQUIRED_PER_LAYER = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                       "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                       "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")


def check(header: GGUFHeader) -> None:
    """Unsupported unless `convert` writes this file, Inconsistent for a file whose tensors
    disagree with its metadata: read from the metadata and the tensor table alone (the
    planner asks, to time the conversion it will run)."""
    arch = str(_value(header, "general.architecture"))
    if arch not in _CLASSES:
        raise Unsupported(f"architecture {arch}")
    if _value(header, "tokenizer.ggml.model") != "gpt2":
        raise Unsupported(f"tokenizer model {_value(header, 'tokenizer.ggml.model')}")
    pre = _value(header, "tokenizer.ggml.pre")
    if pre not in _SPLITS and pre not in _GPT2_SPLIT:
        raise Unsupported(f"pre-tokenizer {pre}")
    tokens = header.fields.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise Unsupported("no vocabulary")
    if "tokenizer.ggml.merges" not in header.fields and tokens.length > _MERGELESS_MAX_TOKENS:
        raise Unsupported("no merges")  # (a vocabulary of single characters needs none)
    _check_shapes(weight_names(header), weight_config(header))


def convert(header: GGUFHeader, out: Path) -> None:
    """Write the model folder for `header` (read with `TOKENIZER_ARRAYS` whole) into `out`,
    all but its weights (`gguf_weights` reads them from the GGUF)."""
    check(header)
    arch = str(_value(header, "general.architecture"))
    tokenizer = _tokenizer(header)
    config = weight_config(header)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(_generation_config(config), indent=2) + "\n")
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(header, arch), indent=2) + "\n")
    template = _value(header, "tokenizer.chat_template")
    if template:
        (out / "chat_template.jinja").write_text(template)


def _value(header: GGUFHeader, key: str, default=None):
    field = header.fields.get(key)
    return default if field is None else field.value


def weight_config(header: GGUFHeader) -> dict:
    """config.json: what the file states of the model's shape; the rest is each config
    class's default, as transformers left it. RoPE scaling and the window are written
    after (`model_store._write_rope`), whichever converter ran."""
    arch = str(_value(header, "general.architecture"))

    def key(name: str, default=None):
        return _value(header, f"{arch}.{name}", default)

    n_tokens = header.fields["tokenizer.ggml.tokens"].length
    config = {
        "architectures": [_CLASSES[arch]],
        "model_type": arch,
        "dtype": "float32",
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count_kv", key("attention.head_count")),
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        # the embedding's rows: a `vocab_size` key past them broke transformers' load
        "vocab_size": _embedding_rows(header) or key("vocab_size", n_tokens),
        "rope_parameters": {"rope_theta": float(key("rope.freq_base", 10000.0)), "rope_type": "default"},
        # llama.cpp writes the output projection only where it is not the embedding
        "tie_word_embeddings": not any(t.name == "output.weight" for t in header.tensors),
        "bos_token_id": _value(header, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _value(header, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _value(header, "tokenizer.ggml.padding_token_id"),
    }
    if (unk := _value(header, "tokenizer.ggml.unknown_token_id")) is not None:
        config["unk_token_id"] = unk
    if None in (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
                config["num_attention_heads"], config["max_position_embeddings"], config["rms_norm_eps"]):
        raise Unsupported("shape keys missing")
    name = _value(header, "general.name")
    if name:
        config["_model_name_or_path"] = name
    # The head width: Llama's from its rotary width, Qwen3's from its key width (a Qwen3 of
    # another width than hidden / heads exists); Qwen2's is always hidden / heads.
    head_dim = key("attention.key_length") if arch == "qwen3" else key("rope.dimension_count") if arch == "llama" else None
    if head_dim is not None:
        config["head_dim"] = int(head_dim)
    return config


def _embedding_rows(header: GGUFHeader) -> int | None:
    embedding = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    return int(embedding.shape[-1]) if embedding is not None and len(embedding.shape) == 2 else None


def _check_shapes(names: list[tuple[Tensor, str]], config: dict) -> None:
    """Inconsistent for a tensor whose shape is not the one the metadata gives it, or a
    layer's tensor missing: converted anyway, such a file failed on every run after with
    an internal error ("shape '[4, 16, 64]' is invalid"), its conversion cached."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv, ff, vocab = config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or hidden // heads
    want = {"model.embed_tokens.weight": (vocab, hidden), "lm_head.weight": (vocab, hidden),
            "model.norm.weight": (hidden,)}
    per_layer = {"input_layernorm.weight": (hidden,), "post_attention_layernorm.weight": (hidden,),
                 "self_attn.q_proj.weight": (heads * head_dim, hidden), "self_attn.q_proj.bias": (heads * head_dim,),
                 "self_attn.k_proj.weight": (kv * head_dim, hidden), "self_attn.k_proj.bias": (kv * head_dim,),
                 "self_attn.v_proj.weight": (kv * head_dim, hidden), "self_attn.v_proj.bias": (kv * head_dim,),
                 "self_attn.o_proj.weight": (hidden, heads * head_dim), "self_attn.q_norm.weight": (head_dim,),
                 "self_attn.k_norm.weight": (head_dim,), "mlp.gate_proj.weight": (ff, hidden),
                 "mlp.up_proj.weight": (ff, hidden), "mlp.down_proj.weight": (hidden, ff)}
    for layer in range(config["num_hidden_layers"]):
        want.update({f"model.layers.{layer}.{k}": v for k, v in per_layer.items()})
    have = {}
    for tensor, name in names:
        shape = tuple(reversed(tensor.shape))
        if name not in want:
            raise Inconsistent(f"tensor {tensor.name} is past the {config['num_hidden_layers']} layers the metadata "
                             "gives")
        if shape != want[name]:
            raise Inconsistent(f"tensor {tensor.name} has shape {list(shape)}; the metadata makes it {list(want[name])}")
        have[name] = tensor
    required = ["model.embed_tokens.weight", "model.norm.weight"] + [
        f"model.layers.{i}.{k}" for i in range(config["num_hidden_layers"]) for k in _REQUIRED_PER_LAYER]
    missing = [n for n in required if n not in have]
    if missing:
        raise Inconsistent(f"it lacks {len(missing)} of its layers' tensors ({missing[0]} first): a file cut or split")


def _generation_config(config: dict) -> dict:
    out = {"_from_model_config": True}
    out.update({k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None})
    return out


def weight_names(header: GGUFHeader) -> list[tuple[Tensor, str]]:
    """(tensor, Hugging Face name) for every weight; Unsupported for a tensor or type this
    converter does not map."""
    out = []
    for t in header.tensors:
        if t.name in _NOT_WEIGHTS:
            continue
        if not gguf_dequant.supported(t.tensor_type):
            raise Unsupported(f"tensor {t.name} of ggml type {t.tensor_type}")
        name = _TOP_LEVEL.get(t.name)
        if name is None:
            parts = t.name.split(".")
            if len(parts) != 4 or parts[0] != "blk" or parts[2] not in _LAYER_MODULES or parts[3] not in ("weight", "bias"):
                raise Unsupported(f"tensor {t.name}")
            name = f"model.layers.{parts[1]}.{_LAYER_MODULES[parts[2]]}.{parts[3]}"
        out.append((t, name))
    return out


def hf_weights(tensor: Tensor, config: dict) -> np.ndarray:
    """One tensor in Hugging Face's layout, float32 (`config`: `weight_config`'s). GGUF lists
    dimensions fastest first; llama.cpp's converter interleaves a Llama file's q and k rows
    within each head (pairs 2i, 2i+1, for its rotary kernel), which transformers'
    rotate-half layout undoes."""
    arch = config["model_type"]
    values = gguf_dequant.dequantize(tensor.data, tensor.tensor_type, tensor.n_elements)
    values = values.reshape(tuple(reversed(tensor.shape)))
    kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
    if arch == "llama" and kind in ("attn_q", "attn_k"):
        heads = config["num_attention_heads"] if kind == "attn_q" else config["num_key_value_heads"]
        rows = values.shape[0]
        values = values.reshape(heads, rows // heads // 2, 2, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)
    return np.ascontiguousarray(values, dtype=np.float32)


def write_safetensors(header: GGUFHeader, path: Path) -> None:
    """The weights as a float32 safetensors file, written tensor by tensor: only one tensor
    is in memory at a time, where saving a loaded model held all of it (28 GB for a 7B
    model)."""
    names, config = weight_names(header), weight_config(header)
    entries = [(name, "F32", tuple(reversed(tensor.shape)), tensor.n_elements * 4) for tensor, name in names]
    with open(path, "wb") as f:
        # each tensor's CRC32 in the metadata, checked as it is read (`weights.TensorReader`,
        # `safetensors_header.verify_checksums`): a cache file changed in place is written again
        write_file(f, entries, (hf_weights(tensor, config) for tensor, _ in names), {"format": "pt"},
                   checksums=True)


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (printable Latin-1
    bytes as themselves, the rest as the characters from U+0100 up, in byte order)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + extra)
            extra += 1
    return out


def _tokenizer(header: GGUFHeader):
    """The byte-level BPE tokenizer the file's vocabulary, merges and token types describe."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    pre = _value(header, "tokenizer.ggml.pre")
    tokens, types = _value(header, "tokenizer.ggml.tokens"), _value(header, "tokenizer.ggml.token_type") or []
    merges = _value(header, "tokenizer.ggml.merges")
    kinds = [types[i] if i < len(types) else 1 for i in range(len(tokens))]
    if merges is None and any(len(t) > 1 for t, kind in zip(tokens, kinds) if kind not in (_CONTROL, _USER_DEFINED)):
        raise Unsupported("no merges for a vocabulary of multi-character tokens")
    alphabet = _byte_alphabet()
    spelled = set(alphabet.values())
    # A token written in plain text (not the byte alphabet) is spelled in it, as BPE makes
    # it; a control or user-defined token keeps its text, matched whole before BPE runs
    # (DeepSeek's "<｜User｜>": spelled in the alphabet, the added token got an id past the
    # embedding, and the model an index error).
    vocab = {(t if set(t) <= spelled or kinds[i] in (_CONTROL, _USER_DEFINED)
              else "".join(alphabet[b] for b in t.encode())): i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges or []]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, dropout=None, unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False, ignore_merges=False))
    if pre in _SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = _template(header, tokens, processors)
    # Special: the control tokens and whatever the file names bos, eos, unk or pad; user-
    # defined tokens (<think>) are matched whole but are text. In id order, as saved.
    named = {_value(header, f"tokenizer.ggml.{k}") for k in ("bos_token_id", "eos_token_id", "unknown_token_id",
                                                             "padding_token_id")} - {None}
    special = [i for i in range(len(tokens)) if kinds[i] == _CONTROL or i in named]
    tok.add_special_tokens([AddedToken(tokens[i], normalized=False, special=True) for i in special])
    user = [t for i, t in enumerate(tokens) if kinds[i] == _USER_DEFINED and i not in named]
    if user:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return tok


def _template(header: GGUFHeader, tokens: list[str], processors):
    """The post-processor: the BOS and EOS the file says an encoding starts and ends with
    (`tokenizer.ggml.add_bos_token`, `add_eos_token`; Llama 3's files set the first), as
    transformers' reading of them adds; none by default."""
    ends = []
    for flag, key in (("add_bos_token", "bos_token_id"), ("add_eos_token", "eos_token_id")):
        i = _value(header, f"tokenizer.ggml.{key}")
        ends.append((tokens[i], i) if _value(header, f"tokenizer.ggml.{flag}") and isinstance(i, int)
                    and 0 <= i < len(tokens) else None)
    bos, eos = ends
    head = [f"{bos[0]}:0"] if bos else []
    tail = [f"{eos[0]}:0"] if eos else []
    single = " ".join([*head, "$A:0", *tail])
    pair = " ".join([*head, "$A:0", *tail, *[t.replace(":0", ":1") for t in head], "$B:1",
                     *[t.replace(":0", ":1") for t in tail]])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=[e for e in (bos, eos) if e])


def _tokenizer_config(header: GGUFHeader, arch: str) -> dict:
    tokens = _value(header, "tokenizer.ggml.tokens")

    def token(key: str) -> str | None:
        i = _value(header, f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    out = {"backend": "tokenizers", "bos_token": token("bos_token_id"), "eos_token": token("eos_token_id"),
           "pad_token": token("padding_token_id"), "tokenizer_class": _TOKENIZER_CLASSES[arch],
           "unk_token": token("unknown_token_id")}
    if arch != "llama":
        out["add_prefix_space"] = None
    return out
