"""Questions sent together about one document: each prefilling it (sharing off, the
behaviour before) against the first computing it and the others copying its rows
(`Engine._share_prefixes`), same process, alternating.

    python -m benchmarks.shared_prefix --json

Bundled SmolLM2 on our engine, prompt cache off, greedy, 24 new tokens each. The document
is the first 12,000 characters of sample_docs/python-tutorial-3.11.rst (about 3K tokens);
4 questions about it go in one batch, as `ktcli serve` batches 4 requests that arrive
together. Reported per side: the batch's wall time (best of --repeats), prompt tokens
prefilled, tokens copied; and whether each answer is the one it gets alone.
A session probe (2026-12-06) timed 4 such requests to the server at 24.8 s at once
against 8.7 s one after another.
"""

from __future__ import annotations

import time

from benchmarks.common import ROOT, arg_parser, machine, report

QUESTIONS = ["What does the tutorial say about the interpreter?", "How do you start Python?",
             "What is the argument passing convention?", "Which editor features are described?"]


def main(argv: list[str] | None = None) -> dict:
    parser = arg_parser("shared_prefix", __doc__, "shared_prefix")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--chars", type=int, default=12000, help="document length, in characters")
    args = parser.parse_args(argv)

    from ktcli.config import load_settings
    from ktcli.engine.backend import SamplingParams
    from ktcli.engine.loading import load_backend

    backend = load_backend(load_settings({"model": "smollm2", "prompt_cache": False}), lambda s: None)
    engine = backend.engine
    document = (ROOT / "sample_docs" / "python-tutorial-3.11.rst").read_text()[: args.chars]
    chats = [[{"role": "user", "content": f"{document}\n\nQuestion: {q}"}] for q in QUESTIONS]
    params = SamplingParams(max_new_tokens=24)
    default_share = engine.min_share

    def batch(share: int) -> tuple[float, list[str], dict]:
        engine.min_share = share
        t0 = time.perf_counter()
        answers = backend.generate_chat_batch(chats, params)
        wall = time.perf_counter() - t0
        st = engine.stats
        return wall, answers, {"prompt_tokens": st.prompt_tokens, "prefilled": st.prefill_tokens,
                               "copied": st.shared_tokens}

    backend.generate_chat_batch([chats[0][:1]], SamplingParams(max_new_tokens=1))  # warm the kernels
    sides = {"separate (before)": 0, "shared": default_share}
    best: dict[str, float] = {}
    answers: dict[str, list[str]] = {}
    tokens: dict[str, dict] = {}
    for _ in range(args.repeats):
        for name, share in sides.items():
            wall, answers[name], tokens[name] = batch(share)
            best[name] = min(best.get(name, wall), wall)
    engine.min_share = default_share
    alone = [backend.generate_chat_batch([chat], params)[0] for chat in chats]
    result = {
        "machine": machine(),
        "document_chars": len(document),
        "requests": len(chats),
        "repeats": args.repeats,
        "sides": {name: {"best_s": round(best[name], 2), **tokens[name],
                         "answers_as_alone": sum(a == b for a, b in zip(answers[name], alone))}
                  for name in sides},
        "speedup": round(best["separate (before)"] / best["shared"], 2),
    }
    for name, side in result["sides"].items():
        print(f"{name}: {side['best_s']:.2f} s for {len(chats)} requests, {side['prefilled']:,} of "
              f"{side['prompt_tokens']:,} prompt tokens prefilled, {side['copied']:,} copied; "
              f"{side['answers_as_alone']}/{len(chats)} answers as alone")
    print(f"speedup {result['speedup']}x")
    return report(args.name, result, args.json)


if __name__ == "__main__":
    main()
