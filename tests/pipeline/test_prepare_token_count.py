"""The plan's count of an input's model tokens (`pipeline.prepare`)."""

from dataclasses import replace


def test_a_long_inputs_count_is_sampled_with_the_models_tokenizer(tmp_path):
    """Logs run 1.46 model tokens per tiktoken token, not the fixed 1.25: a 3.3M-token log
    was planned at 2.9M."""
    import random

    from ktcli.config import Settings
    from ktcli.engine.model_store import ensure_hf_dir, resolve_model
    from ktcli.engine.tokenizer import load_chat_tokenizer
    from ktcli.pipeline.events import NullReporter
    from ktcli.pipeline.prepare import prepare
    from tests.cli.conftest import fresh_cache

    rng = random.Random(1)
    log = tmp_path / "app.log"
    log.write_text("\n".join(f"2024-05-01 12:{i % 60:02d}:07 host{i % 7} svc[{1000 + i}]: id={rng.randrange(10**9)} "
                             f"status=200 took {rng.random():.3f}s" for i in range(6000)))
    settings = replace(Settings(), cache_dir=str(fresh_cache(tmp_path)), device="cpu")
    planned = prepare([str(log)], "Which host failed?", "ask", settings, NullReporter()).plan.input_tokens
    true = len(load_chat_tokenizer(ensure_hf_dir(resolve_model("smollm2"), settings.cache_path)).encode(log.read_text()))
    assert abs(planned - true) < 0.05 * true
