"""Requests of different sampling settings against `ktcli serve`'s engine: batched together
(each row sampled with its own temperature, top-p and seed) against the baseline that
runs only requests of equal settings together, as until 2026-12-05 (and as `--engine hf`).

    python -m benchmarks.serve_mixed_sampling --json

One engine (SmolLM2, one CPU thread) serves both variants in this process, in turn, over
loopback HTTP, each variant from a fresh scheduler:
* mixed: `--clients` clients at once, each with its own temperature (0, 0.5, 0.8, 1.0, ...),
  send `--requests` chat requests in all (closed loop): wall time, aggregate generated
  tokens per second, p50/p95 latency;
* joining: a greedy 300-token stream runs; one second in, a temperature-0.7 request of
  16 tokens is sent: its time to the last token (repeated `--repeats` times, median).
Greedy answers are compared between the variants (the same tokens are expected).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from benchmarks.common import machine, write_result
from benchmarks.serve_load import TOPICS, _percentile, call

TEMPERATURES = (0.0, 0.5, 0.8, 1.0, 0.3, 0.9, 0.6, 1.2)


def _serve(runner):
    from ktcli.serve.server import ServeApp, ServeOptions, make_server

    app = ServeApp(runner, ServeOptions(host="127.0.0.1", port=0, model_id="smollm2", default_max_tokens=64))
    httpd = make_server(app)
    app.scheduler.start()
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return app, httpd


def _chat(i: int, temperature: float, max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": f"Write a long story about {TOPICS[i % len(TOPICS)]}."}],
            "max_tokens": max_tokens, "temperature": temperature, "seed": i}


def mixed(port: int, clients: int, requests: int, max_tokens: int) -> dict:
    results: list[tuple[float, int, float, str]] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def client(k: int) -> None:
        temperature = TEMPERATURES[k % len(TEMPERATURES)]
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            start = time.perf_counter()
            status, reply = call(port, "/v1/chat/completions", _chat(i, temperature, max_tokens))
            text = reply["choices"][0]["message"]["content"] if status == 200 else ""
            tokens = reply.get("usage", {}).get("completion_tokens", 0) if status == 200 else 0
            with lock:
                results.append((time.perf_counter() - start, tokens, temperature, text if status == 200 else "ERROR"))

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    latencies = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    return {"wall_s": round(wall, 2), "tok_s": round(tokens / wall, 2), "generated_tokens": tokens,
            "errors": sum(r[3] == "ERROR" for r in results),
            "p50_s": round(_percentile(latencies, 0.5), 2), "p95_s": round(_percentile(latencies, 0.95), 2)}


def joining(port: int, repeats: int) -> dict:
    waits, greedy_texts = [], []
    for r in range(repeats):
        box: dict = {}

        def stream() -> None:
            box["greedy"] = call(port, "/v1/chat/completions", _chat(r, 0.0, 300))[1]

        long = threading.Thread(target=stream)
        long.start()
        time.sleep(1.0)
        start = time.perf_counter()
        status, _ = call(port, "/v1/chat/completions", _chat(100 + r, 0.7, 16))
        waits.append(time.perf_counter() - start if status == 200 else float("nan"))
        long.join()
        greedy_texts.append(box["greedy"]["choices"][0]["message"]["content"])
    return {"sampled_request_s": [round(w, 2) for w in waits], "median_s": round(statistics.median(waits), 2),
            "greedy_texts": greedy_texts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from ktcli.config import Settings
    from ktcli.engine.batching import NativeRunner
    from ktcli.serve.run import load_engine

    backend = load_engine(Settings(threads=1))
    rows = {}
    for variant, mixes in (("baseline: equal sampling only", False), ("now: any sampling", True)):
        runner = NativeRunner(backend)
        runner.mixes_sampling = mixes  # the baseline's scheduler batches by sampling_key
        app, httpd = _serve(runner)
        port = httpd.server_address[1]
        try:
            call(port, "/v1/chat/completions", _chat(0, 0.0, 4))  # warm-up
            rows[variant] = {"mixed": mixed(port, args.clients, args.requests, args.max_tokens),
                             "joining": joining(port, args.repeats), "health": call(port, "/health")[1]}
        finally:
            httpd.shutdown()
            httpd.server_close()
            app.scheduler.stop(wait_s=30)
        print(f"{variant}: {json.dumps({k: v for k, v in rows[variant].items() if k != 'health'})[:400]}",
              file=sys.stderr)
    (base, now) = rows.values()
    result = {
        "benchmark": "serve_mixed_sampling", "machine": machine(), "engine": "ktcli", "model": "smollm2",
        "server_threads": 1, "clients": args.clients, "requests": args.requests, "max_tokens": args.max_tokens,
        "temperatures": TEMPERATURES[: args.clients], "variants": rows,
        "throughput_ratio": round(now["mixed"]["tok_s"] / base["mixed"]["tok_s"], 2) if base["mixed"]["tok_s"] else None,
        "sampled_request_ratio": round(base["joining"]["median_s"] / now["joining"]["median_s"], 2),
        "same_greedy_answers": base["joining"]["greedy_texts"] == now["joining"]["greedy_texts"],
    }
    path = write_result("serve_mixed_sampling", result)
    print(json.dumps({k: v for k, v in result.items() if k != "variants"}, indent=2) if args.json else f"wrote {path}")


if __name__ == "__main__":
    main()
