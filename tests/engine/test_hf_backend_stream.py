"""transformers' backend stops generating when its reader stops reading."""

from __future__ import annotations

import time

from ktcli.engine.backend import SamplingParams
from ktcli.engine.hf_backend import HFBackend


def test_closing_the_stream_stops_generation_and_records_figures(smollm2_dir):
    backend = HFBackend(smollm2_dir, threads=2)
    stream = backend.stream_chat([{"role": "user", "content": "Count from one to one hundred."}],
                                 SamplingParams(max_new_tokens=200, temperature=0.0))
    pieces = [next(stream) for _ in range(3)]
    start = time.perf_counter()
    stream.close()
    assert time.perf_counter() - start < 5  # the worker thread stopped after its next token
    stats = backend.last_stats
    assert "".join(pieces) and 3 <= stats.new_tokens < 20


def test_a_stop_string_is_cut_from_the_stream_as_from_a_batch(smollm2_dir):
    """transformers stops after the token that completes a stop string, and its streamer
    had passed that text on: answers ended in "\n\n[" or "\nSources:"."""
    backend = HFBackend(smollm2_dir, threads=2)
    messages = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    params = SamplingParams(max_new_tokens=40, temperature=0.0, stop=("5",))
    streamed = "".join(backend.stream_chat(messages, params))
    assert "5" not in streamed and streamed.startswith("1, 2")
    assert streamed == backend.generate_chat_batch([messages], params)[0]
