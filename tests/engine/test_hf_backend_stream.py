"""transformers' backend stops generating when its reader stops reading."""

from __future__ import annotations

import time

from ktcli.engine.backend import SamplingParams
from ktcli.engine.hf_backend import HFBackend


def test_closing_the_stream_stops_generation_and_records_figures(smollm2_hf_dir):
    backend = HFBackend(smollm2_hf_dir, threads=2)
    stream = backend.stream_chat([{"role": "user", "content": "Count from one to one hundred."}],
                                 SamplingParams(max_new_tokens=200, temperature=0.0))
    pieces = [next(stream) for _ in range(3)]
    start = time.perf_counter()
    stream.close()
    assert time.perf_counter() - start < 5  # the worker thread stopped after its next token
    stats = backend.last_stats
    assert "".join(pieces) and 3 <= stats.new_tokens < 20
    assert stats.extra == {"engine": "hf"}  # --json's figures say which engine ran
    # what names its outputs for `pipeline.notes_memo`: the folder's files, dtype, version
    assert backend.outputs_key.startswith(f"hf-{smollm2_hf_dir.name}-") and "-fp32-" in backend.outputs_key


def test_a_stop_string_is_cut_from_the_stream_as_from_a_batch(smollm2_hf_dir):
    """transformers stops after the token that completes a stop string, and its streamer
    had passed that text on: answers ended in "\n\n[" or "\nSources:"."""
    backend = HFBackend(smollm2_hf_dir, threads=2)
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    params = SamplingParams(max_new_tokens=40, temperature=0.0, stop=("5",))
    streamed = "".join(backend.stream_chat(messages, params))
    assert "5" not in streamed and streamed.startswith("1, 2")
    assert streamed == backend.generate_chat_batch([messages], params)[0]


def test_the_token_that_ends_an_answer_is_not_printed(smollm2_hf_dir):
    """A generation_config.json's eos list may hold an ordinary token: transformers stops
    after it and its streamer printed it (and it was counted as answer)."""
    import torch

    backend = HFBackend(smollm2_hf_dir, threads=2)
    comma = backend.tokenizer.encode(",", add_special_tokens=False)[0]
    eos = backend.model.generation_config.eos_token_id
    ends = ([eos] if isinstance(eos, int) else list(eos)) + [comma]
    backend.model.generation_config.eos_token_id = ends
    backend._ends = torch.tensor(ends)
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    params = SamplingParams(max_new_tokens=20, temperature=0.0)
    streamed = "".join(backend.stream_chat(messages, params))
    assert streamed.strip() == "1" and backend.last_stats.new_tokens == 1
    assert backend.generate_chat_batch([messages], params)[0].strip() == "1"


def test_the_window_is_the_scaled_one_as_our_engine_and_the_plan_size_it(tmp_path):
    """YaRN x4 over 1,024 positions: planned at 4,096 tokens, run by transformers' backend
    at 1,024 (its exact count then "exceeded the window")."""
    from tests.cli.test_bad_input import _tiny

    folder = _tiny(tmp_path, "yarn", max_position_embeddings=1024,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 1024})
    assert HFBackend(folder, threads=1).context_window == 4096
    plain = _tiny(tmp_path, "plain", max_position_embeddings=1024)
    assert HFBackend(plain, threads=1).context_window == 1024
