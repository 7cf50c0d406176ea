"""What `ktcli serve` holds, with and without `--max-memory`: its KV pages, its peak RSS
when it starts and after one long request, for float pages (the default) and for a sparse
policy (`--attention topk:4`, whose pages are all written when it starts).

    python -m benchmarks.serve_memory --json

The baseline is the same server without a budget, started in the same run: the engine's
default of pages for 4 windows (up to 32K tokens each) within 30% of free memory.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, machine, report
from benchmarks.serve_load import call, start_server

PAGES = re.compile(r"requests of up to ([\d,]+) tokens and KV pages for ([\d,]+) in all")


def peak_rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def run_config(attention: str, budget: str | None, prompt: str, threads: int, tmp: Path) -> dict:
    log = tmp / f"serve-{attention.replace(':', '-')}-{budget or 'none'}.log"
    extra = ["--attention", attention] + (["--max-memory", budget] if budget else [])
    proc, port = start_server("ktcli", threads, 16, log, *extra)
    try:
        window, pages = (int(x.replace(",", "")) for x in PAGES.search(log.read_text()).groups())
        at_start = peak_rss_mib(proc.pid)
        started = time.perf_counter()
        status, reply = call(port, "/v1/chat/completions",
                             {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "temperature": 0})
        seconds = time.perf_counter() - started
        return {"attention": attention, "max_memory": budget, "window": window, "kv_pages_tokens": pages,
                "peak_rss_start_mib": round(at_start), "peak_rss_after_mib": round(peak_rss_mib(proc.pid)),
                "status": status, "prompt_tokens": reply.get("usage", {}).get("prompt_tokens"),
                "request_s": round(seconds, 1)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="also write benchmarks/results/NAME.json")
    parser.add_argument("--name", default="serve_memory")
    parser.add_argument("--budget", default="1GB", help="the --max-memory compared with none")
    parser.add_argument("--prompt-chars", type=int, default=15_000, help="the long request (~4K tokens)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    # Each server reads the request whole: the prompt cache would let a later one read the
    # earlier one's K/V back (14 s against 273 s, and less memory), which is not compared here.
    os.environ["KTCLI_PROMPT_CACHE"] = "0"
    prompt = (ROOT / "sample_docs" / "python-tutorial-3.11.rst").read_text()[: args.prompt_chars] + "\nSummarize."
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for attention in ("auto", "topk:4"):
            for budget in (None, args.budget):
                rows.append(run_config(attention, budget, prompt, args.threads, Path(tmp)))
                r = rows[-1]
                print(f"{attention:<8} --max-memory {str(budget):<5} window {r['window']:>7,} pages {r['kv_pages_tokens']:>7,} "
                      f"tokens  peak RSS {r['peak_rss_start_mib']:>5,} MiB at start, {r['peak_rss_after_mib']:>5,} after "
                      f"a {r['prompt_tokens']:,}-token request ({r['request_s']} s, HTTP {r['status']})")
    for attention in ("auto", "topk:4"):
        base, ours = (r for r in rows if r["attention"] == attention)
        print(f"{attention}: peak after the request {ours['peak_rss_after_mib'] / base['peak_rss_after_mib']:.2f}x "
              f"the unbudgeted server's; pages {ours['kv_pages_tokens'] / base['kv_pages_tokens']:.2f}x")
    report(args.name, {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "budget": args.budget,
                       "rows": rows}, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
