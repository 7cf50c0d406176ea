"""Our logits and greedy tokens against transformers on the same weights (fp32)."""

import pytest
import torch

from ktcli.engine.backend import SamplingParams
from ktcli.engine.native import NativeBackend

GREEDY = SamplingParams(max_new_tokens=64)
KINDS = ["llama", "llama3-rope", "qwen2", "qwen3", "mistral"]


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return ((ours - ref).abs().max() / ref.abs().max()).item()


def hf_model(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def ours_greedy(backend: NativeBackend, prompts, n=64):
    out = [[] for _ in prompts]
    for i, tok in backend.engine.generate(prompts, SamplingParams(max_new_tokens=n), eos_ids=frozenset()):
        out[i].append(tok)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_logits_and_greedy_match_transformers(tiny_models, kind):
    folder = tiny_models[kind]
    ref = hf_model(folder)
    # 4-token pages and 16-token chunks: a 150-token prompt spans 38 pages and 10 chunks.
    ours = NativeBackend.load(folder, weights="fp32", block_size=4, prefill_chunk=16, kv_budget_bytes=4 << 20)
    g = torch.Generator().manual_seed(7)
    for n in (1, 5, 16, 37, 150):
        ids = torch.randint(0, 256, (n,), generator=g).tolist()
        with torch.no_grad():
            expected = ref(torch.tensor([ids])).logits[0]
        assert rel_err(ours.prompt_logits(ids), expected) < 1e-4, n
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 30, 70)]
    alone = [ours_greedy(ours, [p])[0] for p in prompts]
    for p, toks in zip(prompts, alone):
        assert toks == hf_greedy(ref, p, 64)
    assert ours_greedy(ours, prompts) == alone  # batched == one by one
    assert ours.engine.blocks.num_used == 0  # every page returned


def test_smollm2_logits_match_transformers(smollm2, smollm2_hf):
    """Short and long prompts; the long one spans 3 prefill chunks and 44 pages."""
    text = "The quick brown fox jumps over the lazy dog. " * 80
    for ids in (smollm2.chat_ids([{"role": "user", "content": "What is 2+2?"}]), smollm2.tokenizer.encode(text)[:700]):
        with torch.no_grad():
            expected = smollm2_hf(torch.tensor([ids])).logits[0]
        assert rel_err(smollm2.prompt_logits(ids), expected) < 1e-4, len(ids)


def test_smollm2_greedy_64_tokens_match_transformers(smollm2, smollm2_hf):
    ids = smollm2.chat_ids([{"role": "user", "content": "Write a short poem about the sea."}])
    assert ours_greedy(smollm2, [ids])[0] == hf_greedy(smollm2_hf, ids, 64)


def test_smollm2_batched_equals_one_by_one(smollm2):
    prompts = [
        smollm2.chat_ids([{"role": "user", "content": q}])
        for q in ("Name three colors.", "What is the capital of Italy?", "Count from one to five.")
    ]
    alone = [ours_greedy(smollm2, [p], 24)[0] for p in prompts]
    assert ours_greedy(smollm2, prompts, 24) == alone
