"""A short request sent while a long one runs on `ktcli serve`: continuous batching.

    python -m benchmarks.serve_join --json

Starts `ktcli serve` (our engine, bundled SmolLM2) on a free loopback port. Baseline, in
the same run: the short request (3 tokens) on the idle server. Then the long request
(`--long-tokens`, streamed) starts, and once its tokens flow the short one is sent again.
Reported: the short request's latency alone and during the long one (their ratio), and
the long request's decode rate alone and with the short one joining it. Before requests
could join a running batch the short one waited for the long one to end (the probe of
2026-12-04 measured 0.15 s alone, 2.9 s during a 300-token answer).
"""

from __future__ import annotations

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--long-tokens", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp(prefix="ktcli-serve-join-")) / "serve.log"
    proc, port = start_server("ktcli", args.threads, 16, log)
    try:
        short_latency(port)  # warm-up: first-request costs out of the figures
        alone = [short_latency(port) for _ in range(args.repeats)]
        long_alone, joined, long_joined, chunks = [], [], [], []
        for _ in range(args.repeats):
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
        "short_alone_s": [round(t, 3) for t in alone],
        "short_during_long_s": [round(t, 3) for t in joined],
        "short_during_over_alone": round(statistics.median(joined) / statistics.median(alone), 2),
        "long_chunks": chunks,
        "long_chunks_per_s_alone": [round(r, 1) for r in long_alone],
        "long_chunks_per_s_with_join": [round(r, 1) for r in long_joined],
        "long_rate_with_join_over_alone": round(statistics.median(long_joined) / statistics.median(long_alone), 3),
    }
    path = write_result("serve_join", result)
    print(json.dumps(result, indent=2) if args.json else f"wrote {path}")


if __name__ == "__main__":
    main()
