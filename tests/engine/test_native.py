"""The Backend surface: chat, streaming, batches, stats, memory errors, preemption."""

import pytest
import torch

from ktcli.engine.backend import SamplingParams
from ktcli.engine.native import NativeBackend
from ktcli.errors import OutOfMemoryError

CHAT = [{"role": "user", "content": "Say hello."}]


def test_backend_surface(smollm2):
    assert smollm2.name == "ktcli" and smollm2.context_window == min(8192, smollm2.kv.num_blocks * smollm2.kv.block_size)
    assert smollm2.count_tokens("hello world") == 2
    assert smollm2.prompt_tokens(CHAT) == len(smollm2.chat_ids(CHAT)) > smollm2.count_tokens("Say hello.")
    params = SamplingParams(max_new_tokens=12)
    streamed = "".join(smollm2.stream_chat(CHAT, params))
    st = smollm2.last_stats
    assert st.prompt_tokens == smollm2.prompt_tokens(CHAT) and 0 < st.new_tokens <= 12
    assert st.prefill_s > 0 and st.ttft_s > 0
    for key in ("prefill_tok_s", "decode_tok_s", "kv_pages_peak", "kv_page_bytes", "kv_bytes_peak", "peak_rss_mb"):
        assert key in st.extra
    assert st.extra["kv_pages_in_use"] == 0
    names = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
    assert st.extra["kv_dtype"] == names[smollm2.kv.dtype]  # the pages' dtype by name (a plan says "model")
    batch = smollm2.generate_chat_batch([CHAT, [{"role": "user", "content": "Name a fruit."}]], params)
    assert batch[0] == streamed and len(batch) == 2


def test_stop_string_ends_generation(smollm2):
    full = "".join(smollm2.stream_chat(CHAT, SamplingParams(max_new_tokens=20)))
    assert len(full) > 4
    stop = full[3:5]
    cut = "".join(smollm2.stream_chat(CHAT, SamplingParams(max_new_tokens=20, stop=(stop,))))
    assert cut == full[: full.index(stop)]
    assert smollm2.engine.blocks.num_used == 0


def test_a_prompt_past_the_pages_raises_and_an_answer_stops_at_their_end(tiny_models):
    b = NativeBackend.load(tiny_models["llama"], weights="fp32", block_size=4, kv_budget_bytes=4 * b_per_block(tiny_models["llama"]))
    with pytest.raises(OutOfMemoryError):
        list(b.engine.generate([list(range(40))], SamplingParams(max_new_tokens=4)))
    assert b.engine.blocks.num_used == 0  # nothing leaked
    # The pool is the window a request has: one that decodes to its end stops there, as
    # at the model's window, and frees its pages (it raised, where a server batched it).
    assert b.context_window == b.engine.context_window == 16
    out = list(b.engine.generate([list(range(14))], SamplingParams(max_new_tokens=10)))
    assert len(out) == 2 and b.engine.blocks.num_used == 0


def b_per_block(folder):
    from ktcli.engine.config import load_config

    cfg = load_config(folder)
    return 2 * cfg.n_layers * 4 * cfg.kv_size * 4


def _roomy_and_tight(folder, lengths: tuple[int, ...], seed: int, params: SamplingParams, blocks: int):
    """Random prompts of `lengths`, their tokens with room to spare, and the stream of
    (index, token) a KV budget of `blocks` pages of 4 tokens gives them, with its backend."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]
    want = [[] for _ in prompts]
    for i, t in NativeBackend.load(folder, weights="fp32", block_size=4).engine.generate(prompts, params, frozenset()):
        want[i].append(t)
    tight = NativeBackend.load(folder, weights="fp32", block_size=4, kv_budget_bytes=blocks * b_per_block(folder))
    order = list(tight.engine.generate(prompts, params, frozenset()))
    return want, order, tight


def _by_prompt(order: list[tuple[int, int]], n: int) -> list[list[int]]:
    return [[t for i, t in order if i == k] for k in range(n)]


def test_preemption_gives_the_same_tokens(tiny_models):
    """A budget too small for all sequences at once: some are preempted and recomputed,
    and every sequence still gets exactly the tokens it gets with room to spare."""
    want, order, tight = _roomy_and_tight(tiny_models["qwen2"], (20, 33, 9, 25), 3, SamplingParams(max_new_tokens=24), 22)
    assert _by_prompt(order, 4) == want
    assert tight.engine.stats.preemptions > 0 or tight.engine.stats.peak_pages <= 22
    assert tight.engine.blocks.num_used == 0


def test_a_short_prompt_goes_past_a_long_one_whose_pages_do_not_fit_yet(tiny_models):
    """Only the first waiting sequence was looked at: a 5-token request waited 151 s behind
    7K-token ones whose pages did not fit, with pages free for it (probe 119)."""
    want, order, tight = _roomy_and_tight(tiny_models["qwen2"], (30, 30, 40, 5), 5, SamplingParams(max_new_tokens=8), 24)
    assert _by_prompt(order, 4) == want and tight.engine.blocks.num_used == 0
    first = [next(n for n, (i, _) in enumerate(order) if i == k) for k in range(4)]
    last_of_a = max(n for n, (i, _) in enumerate(order) if i == 0)
    assert first[3] < last_of_a < first[2]  # the short one ran beside the first two; the third waited for pages


def test_bf16_weights_stay_close_to_fp32(tiny_models):
    folder = tiny_models["llama"]
    ids = list(range(3, 60))
    a = NativeBackend.load(folder, weights="fp32", prefill_chunk=16).prompt_logits(ids)
    b = NativeBackend.load(folder, weights="bf16", prefill_chunk=16).prompt_logits(ids)
    assert ((a - b).abs().max() / a.abs().max()).item() < 0.05


def test_a_one_shot_window_past_32k_gets_its_pages(tmp_path):
    """The plan's window reaches a dense read (`loading._long_context`): a 128K-window
    model had pages for 32K tokens only, and its full read of a 43K-token input failed
    "KV cache full" after the plan said it fits. A server's default stays capped."""
    from tests.engine.conftest import build_tiny

    folder = build_tiny("llama", tmp_path / "long", max_position_embeddings=131072)
    one_shot = NativeBackend.load(folder, weights="fp32", context_window=131072, kv_windows=1)
    assert one_shot.kv.num_blocks * one_shot.kv.block_size >= 131072
    served = NativeBackend.load(folder, weights="fp32")
    assert served.kv.num_blocks * served.kv.block_size <= 4 * (32768 + 16)
    ids = list(range(1, 250)) * 160  # 39,840 tokens, past 32K
    out = list(one_shot.engine.generate([ids], SamplingParams(max_new_tokens=2)))
    assert out and one_shot.engine.blocks.num_used == 0


@pytest.mark.parametrize("key, value", [("num_hidden_layers", 0), ("max_position_embeddings", -5),
                                        ("num_attention_heads", 2.5), ("hidden_size", True),
                                        ("num_hidden_layers", 10**400)])
def test_a_config_of_an_impossible_shape_is_refused_naming_it(tmp_path, key, value):
    """What serve loads without a plan: num_hidden_layers 0 was a ZeroDivisionError sizing
    the KV cache."""
    import json

    from ktcli.engine.config import load_config
    from ktcli.errors import UsageError

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_attention_heads": 4, "hidden_size": 64, "num_hidden_layers": 2,
        "intermediate_size": 128, "vocab_size": 256, key: value}))
    with pytest.raises(UsageError, match=f"config.json is not a model config \\({key} is {value!r}"):
        load_config(tmp_path)


@pytest.mark.parametrize("config", [[1, 2], {"text_config": None, "model_type": "llava"}])
def test_a_config_that_is_no_object_is_refused_naming_it(tmp_path, config):
    """A list, or "text_config": null, was an internal AttributeError."""
    import json

    from ktcli.engine.config import load_config
    from ktcli.errors import UsageError

    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UsageError, match="config.json is not a model config \\(a JSON (list|null) where an object"):
        load_config(tmp_path)


def test_a_head_the_config_says_is_its_own_must_be_in_the_weights(tmp_path):
    """Tied silently, our answers differed from transformers', which starts such a head at
    random; a config that does not say ties a missing head, as most releases mean."""
    import json
    from dataclasses import replace

    from safetensors.torch import load_file, save_file

    from ktcli.errors import UsageError
    from tests.engine.conftest import build_tiny

    folder = build_tiny("llama", tmp_path / "untied", tie_word_embeddings=False)
    tensors = load_file(str(folder / "model.safetensors"))
    assert "lm_head.weight" in tensors
    save_file({k: v for k, v in tensors.items() if k != "lm_head.weight"}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    with pytest.raises(UsageError, match="lm_head.weight"):
        NativeBackend.load(folder, weights="fp32", block_size=4)
    # int8 weights packed tied before this refusal (a cache kept from then) are not read back tied
    from ktcli.engine import pack_cache
    from ktcli.engine.config import load_config

    cfg = load_config(folder)
    tied = pack_cache.cache_file(tmp_path / "packed", folder)
    pack_cache.save(tied, pack_cache.load_weights(folder, replace(cfg, tie_embeddings=None), "int8", "cpu"))
    assert pack_cache.load(tied, replace(cfg, tie_embeddings=None)) is not None
    with pytest.raises(UsageError, match="lm_head.weight"):
        NativeBackend.load(folder, weights="int8", block_size=4, pack_cache=tmp_path / "packed")
    config = json.loads((folder / "config.json").read_text())
    del config["tie_word_embeddings"]
    (folder / "config.json").write_text(json.dumps(config))
    backend = NativeBackend.load(folder, weights="fp32", block_size=4)
    assert backend.engine.model.w.lm_head is backend.engine.model.w.embed


@pytest.mark.parametrize("kv_dtype,attention", [("fp32", None), ("int8", "window"), ("fp8", "topk")])
def test_the_stats_name_the_pages_dtype(tiny_models, kv_dtype, attention):
    policy = {"attention": attention} if attention else {}
    b = NativeBackend.load(tiny_models["llama"], weights="fp32", kv_dtype=kv_dtype, kv_budget_bytes=4 << 20, **policy)
    list(b.engine.generate([list(range(1, 40))], SamplingParams(max_new_tokens=2)))  # (no tokenizer: ids only)
    b._record()
    assert b.last_stats.extra["kv_dtype"] == kv_dtype
