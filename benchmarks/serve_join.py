"""A short request sent while a long one runs on `ktcli serve`: continuous batching.

    python -m benchmarks.serve_join --json

Starts `ktcli serve` (our engine, bundled SmolLM2) on a free loopback port. Baseline, in
the same run: the short request (3 tokens) on the idle server. Then the long request
(`--long-tokens`, streamed) starts, and once its tokens flow the short one is sent again.
Reported: the short request's latency alone and during the long one (their ratio), and
the long request's decode rate alone and with the short one joining it.

Second part (`--long-prompt-tokens`, 0 skips it): a long prompt (6,000 tokens of the
Python tutorial, 8 new tokens) and, sent once its prefill has begun, a short streamed
request (8 tokens): the short one's first token and its whole answer during the long
prefill against the same request alone (same run), and the long prompt's own time alone
and with the short one beside it. A session probe (2026-12-05) saw 5.5 s to the short
one's first token and 11 s for its 8 tokens, against 0.25 and 0.5 s alone. Before requests
could join a running batch the short one waited for the long one to end (the probe of
2026-12-04 measured 0.15 s alone, 2.9 s during a 300-token answer).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import machine, write_result
from benchmarks.serve_load import call, start_server

SHORT = {"prompt": "Hi", "max_tokens": 3, "temperature": 0}


def short_latency(port: int) -> float:
    started = time.perf_counter()
    status, body = call(port, "/v1/completions", SHORT)
    if status != 200:
        raise SystemExit(f"short request failed: {status} {body}")
    return time.perf_counter() - started


def long_stream(port: int, tokens: int, first_tokens: threading.Event, out: dict) -> None:
    """The long request, streamed; `out`: its wall time and chunk count."""
    body = json.dumps({"prompt": "1, 2, 3, 4,", "max_tokens": tokens, "temperature": 0, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=600) as conn:
        started = time.perf_counter()
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(body)).encode()
                     + b"\r\n\r\n" + body)
        seen = b""
        while b"[DONE]" not in seen:
            data = conn.recv(65536)
            if not data:
                break
            seen += data
            if seen.count(b"data: ") >= 4:
                first_tokens.set()
        out["wall_s"] = time.perf_counter() - started
        out["chunks"] = seen.count(b"data: ") - 1  # [DONE]


SHORT_STREAM = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "stream": True}


def streamed(port: int, body: dict) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the end, tokens) of one streamed completion."""
    data = json.dumps(body).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=600) as conn:
        started = time.perf_counter()
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + str(len(data)).encode()
                     + b"\r\n\r\n" + data)
        seen, first = b"", 0.0
        while b"[DONE]" not in seen:
            part = conn.recv(65536)
            if not part:
                break
            seen += part
            # the first event is the role-only chunk; a token's text comes after it
            if not first and seen.count(b"data: ") >= 2:
                first = time.perf_counter() - started
        return first, time.perf_counter() - started, seen.count(b"data: ") - 2


def long_prompt_text(tokens: int) -> str:
    """About `tokens` tokens of the bundled tutorial (4 characters a token is close for it)."""
    text = (Path(__file__).resolve().parents[1] / "sample_docs" / "python-tutorial-3.11.rst").read_text()
    return text[: tokens * 4]


def prefill_join(port: int, prompt_tokens: int, repeats: int) -> dict:
    body = {"prompt": long_prompt_text(prompt_tokens), "max_tokens": 8, "temperature": 0}
    alone_short, during_short, long_alone, long_with = [], [], [], []
    for _ in range(repeats):
        alone_short.append(streamed(port, SHORT_STREAM))
        started = time.perf_counter()
        call(port, "/v1/completions", body)
        long_alone.append(time.perf_counter() - started)
        out: dict = {}

        def long_one() -> None:
            t0 = time.perf_counter()
            call(port, "/v1/completions", body)
            out["s"] = time.perf_counter() - t0

        worker = threading.Thread(target=long_one)
        worker.start()
        time.sleep(0.5)  # its prefill has begun (the prompt is tokenized and queued within ~0.1 s)
        during_short.append(streamed(port, SHORT_STREAM))
        worker.join()
        long_with.append(out["s"])
    med = statistics.median
    return {
        "long_prompt_tokens": prompt_tokens,
        "short_alone_first_s": [round(a[0], 3) for a in alone_short],
        "short_alone_total_s": [round(a[1], 3) for a in alone_short],
        "short_during_prefill_first_s": [round(d[0], 3) for d in during_short],
        "short_during_prefill_total_s": [round(d[1], 3) for d in during_short],
        "short_tokens": [d[2] for d in during_short],
        "first_during_over_alone": round(med(d[0] for d in during_short) / med(a[0] for a in alone_short), 2),
        "total_during_over_alone": round(med(d[1] for d in during_short) / med(a[1] for a in alone_short), 2),
        "long_alone_s": [round(t, 2) for t in long_alone],
        "long_with_short_s": [round(t, 2) for t in long_with],
        "long_with_over_alone": round(med(long_with) / med(long_alone), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--long-tokens", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--long-prompt-tokens", type=int, default=6000)
    parser.add_argument("--skip-decode-join", action="store_true", help="only the long-prompt part")
    parser.add_argument("--name", default="serve_join")
    args = parser.parse_args()
    # The long prompt is sent again and again: read back from the prompt cache, it would
    # need no prefill at all.
    os.environ["KTCLI_PROMPT_CACHE"] = "0"
    log = Path(tempfile.mkdtemp(prefix="ktcli-serve-join-")) / "serve.log"
    proc, port = start_server("ktcli", args.threads, 16, log)
    prefill: dict = {}
    alone, joined, long_alone, long_joined, chunks = [], [], [], [], []
    try:
        short_latency(port)  # warm-up: first-request costs out of the figures
        if args.long_prompt_tokens:
            prefill = prefill_join(port, args.long_prompt_tokens, args.repeats)
            print(json.dumps(prefill), flush=True)
        for _ in range(0 if args.skip_decode_join else args.repeats):
            alone.append(short_latency(port))
        for _ in range(0 if args.skip_decode_join else args.repeats):
            out: dict = {}
            flowing = threading.Event()
            worker = threading.Thread(target=long_stream, args=(port, args.long_tokens, flowing, out))
            worker.start()
            flowing.wait(120)
            joined.append(short_latency(port))
            worker.join()
            long_joined.append(out["chunks"] / out["wall_s"])
            chunks.append(out["chunks"])
            out = {}
            worker = threading.Thread(target=long_stream, args=(port, args.long_tokens, threading.Event(), out))
            worker.start()
            worker.join()
            long_alone.append(out["chunks"] / out["wall_s"])
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    result = {
        "benchmark": "serve_join", "machine": machine(), "engine": "ktcli", "model": "smollm2",
        "threads": args.threads, "long_tokens": args.long_tokens, "repeats": args.repeats,
    }
    if alone:
        result |= {
            "short_alone_s": [round(t, 3) for t in alone],
            "short_during_long_s": [round(t, 3) for t in joined],
            "short_during_over_alone": round(statistics.median(joined) / statistics.median(alone), 2),
            "long_chunks": chunks,
            "long_chunks_per_s_alone": [round(r, 1) for r in long_alone],
            "long_chunks_per_s_with_join": [round(r, 1) for r in long_joined],
            "long_rate_with_join_over_alone": round(statistics.median(long_joined) / statistics.median(long_alone), 3),
        }
    if prefill:
        result["during_long_prefill"] = prefill
    path = write_result(args.name, result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")


if __name__ == "__main__":
    main()
