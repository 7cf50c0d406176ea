"""Next-token choice: greedy, or temperature with optional top-k and top-p."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ktcli.engine.backend import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams | Sequence[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """logits [B, vocab] float32 -> one token id per row. Each row draws from its own
    generator, so a sequence samples the same tokens alone or in a batch. `params`: one
    for every row, or each row's own (a server's requests of different temperatures
    share a batch): rows alike are sampled together."""
    if isinstance(params, SamplingParams):
        return _sample_alike(logits, params, generators)
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(_choice_key(p), []).append(i)
    if len(groups) == 1:
        return _sample_alike(logits, params[0], generators)
    out = [0] * len(params)
    for rows in groups.values():
        picked = _sample_alike(logits[rows], params[rows[0]], [generators[i] for i in rows])
        for i, token in zip(rows, picked):
            out[i] = token
    return out


def _choice_key(p: SamplingParams) -> tuple:
    """What decides a row's choice besides its generator: equal keys sample alike."""
    return ("greedy",) if p.temperature <= 0 else (p.temperature, p.top_k, p.top_p)


def _sample_alike(logits: torch.Tensor, params: SamplingParams, generators: list[torch.Generator | None]) -> list[int]:
    if params.temperature <= 0:
        if logits.device.type == "cpu" and logits.dtype == torch.float32:
            # numpy's argmax over a 49K vocabulary: ~10 us; torch's CPU argmax ~110 us here
            return logits.numpy().argmax(axis=-1).tolist()
        return logits.argmax(dim=-1).tolist()
    # Each row's best logit first goes to 0: divided by a tiny temperature (1e-40) the raw
    # logits overflowed to inf and softmax gave NaN; now the best stays finite.
    scaled = (logits - logits.max(dim=-1, keepdim=True).values) / params.temperature
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]  # [B, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first
        # token is always kept).
        drop = probs.cumsum(-1) - probs >= params.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
    probs = scaled.softmax(-1)
    # One draw per row on the logits' device, read back together: one sync per step.
    draws = [torch.multinomial(probs[i], 1, generator=g) for i, g in enumerate(generators)]
    return (torch.cat(draws) if len(draws) > 1 else draws[0]).tolist()


def make_generator(params: SamplingParams, device: torch.device | str = "cpu") -> torch.Generator | None:
    """A generator on the device the logits live on (multinomial needs them together)."""
    if params.temperature <= 0:
        return None
    g = torch.Generator(device=device)
    if params.seed is not None:
        g.manual_seed(params.seed)
    else:
        g.seed()
    return g
