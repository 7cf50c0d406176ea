import os
import re
from pathlib import Path

import pytest

from ktcli.config import load_settings
from ktcli.errors import UsageError


def use_config(folder, monkeypatch, text: str):
    """KTCLI_CONFIG at a file holding `text` (empty: the user's own config must not reach
    the test); returns its path."""
    path = folder / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("KTCLI_CONFIG", str(path))
    return path


def test_precedence_flags_over_env_over_file(tmp_path, monkeypatch):
    use_config(tmp_path, monkeypatch, 'top_k = 3\nmodel = "from-file"\nchunk_tokens = 128\n')
    monkeypatch.setenv("KTCLI_TOP_K", "5")
    monkeypatch.setenv("KTCLI_MODEL", "from-env")
    s = load_settings({"model": "from-flag", "top_k": None})
    assert s.model == "from-flag"
    assert s.top_k == 5
    assert s.chunk_tokens == 128


def test_cache_dir_env(tmp_path, monkeypatch):
    use_config(tmp_path, monkeypatch, "")
    monkeypatch.setenv("KTCLI_CACHE_DIR", str(tmp_path / "c"))
    assert load_settings().cache_path == tmp_path / "c"


def test_bad_values_are_usage_errors(tmp_path, monkeypatch):
    use_config(tmp_path, monkeypatch, "")
    monkeypatch.setenv("KTCLI_TOP_K", "many")
    with pytest.raises(UsageError, match="KTCLI_TOP_K"):
        load_settings()


def test_unknown_key_in_file(tmp_path, monkeypatch):
    use_config(tmp_path, monkeypatch, "colour = 'red'\n")
    with pytest.raises(UsageError, match="colour"):
        load_settings()
    use_config(tmp_path, monkeypatch, "topk = 4\n")  # a near miss is named, as a variable's is
    with pytest.raises(UsageError, match=r"unknown setting 'topk' \(top_k\?\)"):
        load_settings()


@pytest.mark.parametrize("flags, needle", [
    ({"kv_dtype": "int3"}, "--kv-dtype 'int3': choose auto, fp32"),
    ({"attention": "bogus"}, "attention 'bogus': choose one of dense, window, topk"),
    ({"attention": "topk:0"}, "page count of at least 1"),
    ({"attention": "dense:4"}, "dense reads every page and takes no count"),  # was told to give a count
    ({"rope_scaling": "magic:2"}, "--rope-scaling 'magic:2'"),
    ({"rope_scaling": "yarn:0.5"}, "factor must be from 1 to 1024"),
    ({"rope_scaling": "yarn:inf"}, "factor must be from 1 to 1024"),
    ({"rope_scaling": "linear:1e9"}, "factor must be from 1 to 1024"),
    ({"mode": "fast"}, "--mode 'fast'"),
    ({"engine": "vllm"}, "--engine 'vllm': choose ktcli or hf"),
    ({"weights": "int2"}, "--weights 'int2'"),
    ({"max_new_tokens": 0}, "--max-new-tokens 0: must be at least 1"),
    ({"top_k": 0}, "--top-k 0"),
    ({"max_seconds": -3.0}, "--max-seconds -3: must be at least 0"),  # as typed, not "-3.0 ... 0.0"
    ({"temperature": float("nan")}, "--temperature nan"),
    ({"device": "tpu"}, "--device 'tpu': choose auto, cpu, cuda or cuda:N"),  # was said after the input was read
])
def test_values_no_command_can_use_are_rejected_up_front(tmp_path, monkeypatch, flags, needle):
    use_config(tmp_path, monkeypatch, "")
    with pytest.raises(UsageError, match=re.escape(needle)):
        load_settings(flags)


def test_accepted_values_pass_and_kv_kinds_match_the_kernels(tmp_path, monkeypatch):
    import kernels.layout

    from ktcli.config import KV_DTYPES

    use_config(tmp_path, monkeypatch, "")
    s = load_settings({"kv_dtype": "int4", "attention": "topk:16", "rope_scaling": "yarn:4", "max_seconds": 30.0})
    assert (s.kv_dtype, s.attention, s.rope_scaling) == ("int4", "topk:16", "yarn:4")
    assert load_settings({"rope_scaling": "none", "attention": "window"}).rope_scaling == "none"
    assert KV_DTYPES == kernels.layout.KV_KINDS


def test_default_overlap_follows_the_chunk_size(tmp_path, monkeypatch):
    use_config(tmp_path, monkeypatch, "")
    assert load_settings().overlap_tokens == 32  # an eighth of the default 256
    assert load_settings({"chunk_tokens": 16}).overlap_tokens == 2  # a fixed 32 would not fit
    monkeypatch.setenv("KTCLI_CHUNK_OVERLAP", "0")
    assert load_settings({"chunk_tokens": 16}).overlap_tokens == 0


def test_a_named_config_file_that_is_missing_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KTCLI_CONFIG", str(tmp_path / "typo.toml"))
    with pytest.raises(UsageError, match="typo.toml: no such file"):
        load_settings()
    monkeypatch.setenv("KTCLI_CONFIG", str(tmp_path))
    with pytest.raises(UsageError, match="a folder, not a file"):
        load_settings()


def test_a_relative_cache_dir_in_a_config_file_is_beside_the_file(tmp_path, monkeypatch):
    """Resolved against the folder a command ran in, a cron job's runs from two folders made
    two caches and converted the model twice."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "ktcli.toml").write_text('cache_dir = "relcache"\n')
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv("KTCLI_CONFIG", str(tmp_path / "conf" / "ktcli.toml"))
    monkeypatch.delenv("KTCLI_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert load_settings().cache_path == tmp_path / "conf" / "relcache"
    monkeypatch.setenv("KTCLI_CACHE_DIR", "here")  # the environment's and a flag's: from where it runs
    assert load_settings().cache_path == Path("here")
    (tmp_path / "conf" / "ktcli.toml").write_text('cache_dir = "~/kc"\n')
    monkeypatch.delenv("KTCLI_CACHE_DIR")
    assert load_settings().cache_path == Path("~/kc").expanduser()


def test_a_config_that_is_no_regular_file_is_read(tmp_path, monkeypatch):
    """KTCLI_CONFIG=/dev/null (no config) and a FIFO (bash's <(echo 'top_k = 3')) were
    refused as "no such file"."""
    import threading

    monkeypatch.setenv("KTCLI_CONFIG", os.devnull)
    assert load_settings().top_k == load_settings({}).top_k
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w") as f:
            f.write("top_k = 3\n")

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    monkeypatch.setenv("KTCLI_CONFIG", str(fifo))
    assert load_settings().top_k == 3
    writer.join(5)


def test_a_config_file_past_any_config_size_is_refused(tmp_path, monkeypatch):
    """Now that a device can be named, one that never ends (a mistaken /dev/zero) is not
    read forever."""
    use_config(tmp_path, monkeypatch, "# padding\n" * 200_000)
    with pytest.raises(UsageError, match="over 1 MiB, which no config file is"):
        load_settings()


def test_errors_name_where_the_value_came_from(tmp_path, monkeypatch):
    cfg = use_config(tmp_path, monkeypatch, "top_k = 0\n")
    with pytest.raises(UsageError, match=rf"^top_k in {re.escape(str(cfg))} 0: must be at least 1"):
        load_settings()
    cfg.write_text("")
    monkeypatch.setenv("KTCLI_MODE", "bogus")
    with pytest.raises(UsageError, match="^KTCLI_MODE 'bogus': choose"):
        load_settings()
    with pytest.raises(UsageError, match="^--mode 'magic': choose"):  # a flag wins, and is named as one
        load_settings({"mode": "magic"})
    monkeypatch.delenv("KTCLI_MODE")
    monkeypatch.setenv("KTCLI_ATTENTION", "topk:0")
    with pytest.raises(UsageError, match="^KTCLI_ATTENTION 'topk:0'"):
        load_settings()
    monkeypatch.delenv("KTCLI_ATTENTION")
    monkeypatch.setenv("KTCLI_CHUNK_OVERLAP", "300")
    with pytest.raises(UsageError, match=r"^KTCLI_CHUNK_OVERLAP 300: must be below the chunk size \(256\)"):
        load_settings()
    with pytest.raises(UsageError, match="^--chunk-tokens 0: must be at least 1"):
        load_settings({"chunk_tokens": 0, "chunk_overlap": 0})
    monkeypatch.delenv("KTCLI_CHUNK_OVERLAP")
    with pytest.raises(UsageError, match="^--max-memory 'lots': give a size"):
        load_settings({"max_memory": "lots"})
    with pytest.raises(UsageError, match="^--max-memory '1' is 1 byte, under 1 MiB: give a size like 4GB"):
        load_settings({"max_memory": "1"})  # planned as a budget of 1 byte
    cfg.write_text('top_k = "x"\n')
    with pytest.raises(UsageError, match=rf"^top_k in {re.escape(str(cfg))} 'x': not a whole number"):
        load_settings()
    cfg.write_text("top_k = 1.7\n")  # not quietly 1
    with pytest.raises(UsageError, match=rf"^top_k in {re.escape(str(cfg))} 1.7: not a whole number"):
        load_settings()
    cfg.write_text("top_k = 4.0\n")
    assert load_settings().top_k == 4
    cfg.write_text("")
    monkeypatch.setenv("KTCLI_TOP_K", "many")
    with pytest.raises(UsageError, match="^KTCLI_TOP_K 'many': not a whole number"):
        load_settings()


@pytest.mark.parametrize("flags, needle", [
    ({"engine": "hf", "weights": "int8"}, "--weights 'int8': the transformers engine"),
    ({"engine": "hf", "kv_dtype": "int4"}, "--kv-dtype 'int4': the transformers engine (--engine hf) has no paged KV"),
    ({"engine": "hf", "attention": "topk"}, "--attention 'topk': the transformers engine"),
])
def test_flags_the_transformers_engine_cannot_apply_are_refused(tmp_path, monkeypatch, flags, needle):
    use_config(tmp_path, monkeypatch, "")
    with pytest.raises(UsageError, match=re.escape(needle)):
        load_settings(flags)
    assert load_settings({"engine": "hf", "weights": "bf16"}).engine == "hf"


@pytest.mark.parametrize("flags, needle", [
    ({"kv_dtype": "int4"}, "--kv-dtype 'int4': an OpenAI-compatible server (--backend openai) keeps its own"),
    ({"attention": "topk"}, "--attention 'topk': an OpenAI-compatible server"),
    ({"rope_scaling": "yarn:4"}, "--rope-scaling 'yarn:4': an OpenAI-compatible server"),
    ({"weights": "int8"}, "--weights 'int8': an OpenAI-compatible server"),
    ({"mode": "sparse"}, "--mode 'sparse': an OpenAI-compatible server"),  # tried to reach the server first
])
def test_flags_only_the_local_engine_can_apply_are_refused_for_a_server(tmp_path, monkeypatch, flags, needle):
    # They crashed the plan (paged KV bytes of a model with no known heads) or were ignored.
    use_config(tmp_path, monkeypatch, "")
    server = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1"}
    with pytest.raises(UsageError, match=re.escape(needle)):
        load_settings({**server, **flags})
    assert load_settings({**server, "attention": "dense"}).backend == "openai"


def test_the_prefill_dtype_variable_is_checked_with_the_settings(tmp_path, monkeypatch):
    # The engine reads it after the model has loaded; `plan` never got that far.
    use_config(tmp_path, monkeypatch, "")
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "bogus")
    with pytest.raises(UsageError, match="^KTCLI_PREFILL_DTYPE='bogus': choose auto, fp32, bf16"):
        load_settings()
    monkeypatch.setenv("KTCLI_PREFILL_DTYPE", "BF16")
    assert load_settings()


def test_a_base_url_flag_without_the_openai_backend_is_refused(tmp_path, monkeypatch):
    # It was ignored and the local model answered. Set in the config file or environment,
    # for the runs that add --backend openai, it stays quiet.
    use_config(tmp_path, monkeypatch, "")
    with pytest.raises(UsageError, match=re.escape("--base-url http://h:8000/v1: it names an OpenAI-compatible "
                                                   "server, which needs --backend openai as well")):
        load_settings({"base_url": "http://h:8000/v1"})
    monkeypatch.setenv("KTCLI_BASE_URL", "http://h:8000/v1")
    assert load_settings().backend == "local"


def test_a_cache_dir_that_is_a_file_or_cannot_be_made_is_refused(tmp_path, monkeypatch):
    use_config(tmp_path, monkeypatch, "")
    afile = tmp_path / "a.txt"
    afile.write_text("x")
    with pytest.raises(UsageError, match="--cache-dir .*a.txt: not a folder"):
        load_settings({"cache_dir": str(afile)})
    with pytest.raises(UsageError, match="cannot create it"):
        load_settings({"cache_dir": str(afile / "sub")})
    later = tmp_path / "new" / "cache"
    assert load_settings({"cache_dir": str(later)}).cache_path == later
    assert not later.exists() and not later.parent.exists()  # checked, not made: `plan` is a dry run
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root may write anywhere
        with pytest.raises(UsageError, match="locked is not writable"):
            load_settings({"cache_dir": str(locked / "cache")})


def test_a_cache_dir_through_a_symlink_loop_or_to_nothing_is_refused(tmp_path, monkeypatch):
    # exists() says no for a symlink to itself, and its parent was writable: `plan` said
    # nothing, exit 0, and `ask` read its input before failing to convert into it.
    use_config(tmp_path, monkeypatch, "")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    for bad in (loop, loop / "sub"):
        with pytest.raises(UsageError, match="--cache-dir .*loop.*: cannot use it .*symbolic links"):
            load_settings({"cache_dir": str(bad)})
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    with pytest.raises(UsageError, match="dangling: a symbolic link to .*gone, which does not exist"):
        load_settings({"cache_dir": str(dangling)})
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert load_settings({"cache_dir": str(tmp_path / "link")}).cache_path == tmp_path / "link"


def test_temperature_and_threads_have_upper_bounds(tmp_path, monkeypatch):
    from ktcli.config import usable_cpus

    use_config(tmp_path, monkeypatch, "")
    with pytest.raises(UsageError, match="--temperature 100.0: must be at most 2.0"):
        load_settings({"temperature": 100.0})
    assert load_settings({"temperature": 2.0}).temperature == 2.0
    with pytest.raises(UsageError, match=f"this process may use {usable_cpus()} CPUs"):
        load_settings({"threads": usable_cpus() + 1})
    assert load_settings({"threads": usable_cpus()}).threads == usable_cpus()


def test_a_missing_model_is_named_where_it_was_set(tmp_path, monkeypatch):
    # a config file's model was reported as "--model ...", a flag the user never typed
    from ktcli.engine.model_store import resolve_model

    path = use_config(tmp_path, monkeypatch, 'model = "no-such-model"\n')
    for env, flag, named in ((None, None, f"model in {path}"), ("also-missing", None, "KTCLI_MODEL"),
                             ("also-missing", "flag-missing", "--model")):
        if env:
            monkeypatch.setenv("KTCLI_MODEL", env)
        s = load_settings({"model": flag})
        with pytest.raises(UsageError, match=f"^{re.escape(named)} {s.model}: no such file"):
            resolve_model(s.model, s.named("model"))
    assert load_settings({}) == load_settings({}) and "origins" not in repr(load_settings({}))


@pytest.mark.parametrize(("config", "env", "flags", "needle"), [
    (b'model = "caf\xe9"\n', {}, {}, "not UTF-8 text"),  # was an internal UnicodeDecodeError
    (b"", {}, {"max_memory": "inf"}, "--max-memory 'inf'"),  # int(inf): an internal OverflowError
    (b"", {"KTCLI_MAX_MEMORY": "1e999GB"}, {}, "KTCLI_MAX_MEMORY"),
    (b"", {}, {"max_seconds": "inf"}, "--max-seconds inf: not a finite number"),  # was an "infs budget"
    (b"max_new_tokens = true\n", {}, {}, "not a whole number"),  # TOML's true was 1
    (b"", {"KTCLI_PROMPT_CACHE": "maybe"}, {}, "KTCLI_PROMPT_CACHE 'maybe': not true or false"),  # was false
])
def test_values_that_are_no_setting_are_usage_errors(tmp_path, monkeypatch, config, env, flags, needle):
    path = tmp_path / "config.toml"
    path.write_bytes(config)
    monkeypatch.setenv("KTCLI_CONFIG", str(path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError, match=re.escape(needle)):
        load_settings(flags)


def test_booleans_read_as_words(tmp_path, monkeypatch):
    use_config(tmp_path, monkeypatch, "prompt_cache = false\n")
    assert load_settings().prompt_cache is False
    monkeypatch.setenv("KTCLI_PROMPT_CACHE", " On ")
    assert load_settings().prompt_cache is True
    monkeypatch.setenv("KTCLI_PROMPT_CACHE", "0")
    assert load_settings().prompt_cache is False


def test_a_misspelled_variable_is_named_with_what_it_may_mean(tmp_path, monkeypatch):
    """KTCLI_TOPK=3 was ignored without a word."""
    from ktcli.config import unknown_variables

    use_config(tmp_path, monkeypatch, "")
    for name in [k for k in os.environ if k.startswith("KTCLI_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("KTCLI_TOPK", "3")
    monkeypatch.setenv("KTCLI_NO_CPP_KERNELS", "1")  # an engine switch: known
    assert unknown_variables() == ["KTCLI_TOPK is not a ktcli variable, ignored (KTCLI_TOP_K?)"]


def test_every_variable_the_sources_read_is_known():
    """So that no variable of ours is ever called unknown."""
    from dataclasses import fields
    from pathlib import Path

    from ktcli.config import OTHER_VARIABLES, Settings

    root = Path(__file__).resolve().parents[1]
    names = set()
    for folder in ("ktcli", "kernels", "scripts", "benchmarks", "tests"):
        for path in (root / folder).rglob("*"):
            if path.suffix in (".py", ".sh") and path.name != "test_config.py":
                names |= set(re.findall(r"KTCLI_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")))
    names.discard("KTCLI_TOPK")  # config.py's docstring example of a misspelling
    settings = {f"KTCLI_{f.name.upper()}" for f in fields(Settings)}
    assert names - settings - OTHER_VARIABLES == set()


def test_an_empty_cache_dir_flag_is_refused_and_a_tilde_is_the_home(tmp_path, monkeypatch):
    """`--cache-dir ""` overrode KTCLI_CACHE_DIR with the default, silently; a config's
    "~/.cache/x" made a folder named "~" in the working directory."""
    from ktcli.config import load_settings
    from ktcli.errors import UsageError

    monkeypatch.setenv("KTCLI_CACHE_DIR", str(tmp_path / "env-cache"))
    with pytest.raises(UsageError, match="--cache-dir is empty"):
        load_settings({"cache_dir": ""})
    monkeypatch.delenv("KTCLI_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "config.toml"
    config.write_text('cache_dir = "~/.cache/mine"\n')
    monkeypatch.setenv("KTCLI_CONFIG", str(config))
    assert load_settings().cache_path == tmp_path / ".cache" / "mine"


def test_a_server_url_the_local_backend_does_not_use_is_said(monkeypatch):
    from ktcli.config import load_settings, unused_settings

    monkeypatch.setenv("KTCLI_BASE_URL", "http://127.0.0.1:8000/v1")
    (line,) = unused_settings(load_settings())
    assert line.startswith("KTCLI_BASE_URL is set but the backend is local")
    monkeypatch.setenv("KTCLI_BACKEND", "openai")
    assert unused_settings(load_settings()) == []


def test_a_file_size_limit_takes_units_as_the_memory_budget_does(tmp_path, monkeypatch):
    """--max-file-bytes 2.5MB was refused ("not a valid integer") where --max-memory 4GB is taken."""
    use_config(tmp_path, monkeypatch, "")
    monkeypatch.delenv("KTCLI_MAX_FILE_BYTES", raising=False)
    assert load_settings({"max_file_bytes": "2.5MB"}).max_file_bytes == 2_500_000
    assert load_settings({"max_file_bytes": "3MiB"}).max_file_bytes == 3 * 2**20
    assert load_settings({"max_file_bytes": "2000000"}).max_file_bytes == 2_000_000
    monkeypatch.setenv("KTCLI_MAX_FILE_BYTES", "1KB")
    assert load_settings().max_file_bytes == 1000
    with pytest.raises(UsageError, match="not a size above 0, like"):
        load_settings({"max_file_bytes": "lots"})
    with pytest.raises(UsageError, match="max-file-bytes 0: not a size above 0"):  # was "not a size": it is one
        load_settings({"max_file_bytes": "0"})


def test_exclude_from_a_flag_the_environment_or_the_config_file(tmp_path, monkeypatch):
    path = use_config(tmp_path, monkeypatch, 'exclude = ["tests/fixtures/**", "*.csv"]\n')
    assert load_settings().exclude == ("tests/fixtures/**", "*.csv")
    monkeypatch.setenv("KTCLI_EXCLUDE", "*.lock, build/")  # a variable holds one string: commas part it
    assert load_settings().exclude == ("*.lock", "build/")
    assert load_settings({"exclude": ["docs/**"]}).exclude == ("docs/**",)  # a flag wins, as for every setting
    assert load_settings({"exclude": None}).exclude == ("*.lock", "build/")
    monkeypatch.delenv("KTCLI_EXCLUDE")
    path.write_text("exclude = 3\n")
    with pytest.raises(UsageError, match=r"exclude in .*config.toml 3: not a list of patterns"):
        load_settings()
    path.write_text('exclude = ["#notes"]\n')
    with pytest.raises(UsageError, match=r"exclude in .*config.toml '#notes': matches nothing"):
        load_settings()
    with pytest.raises(UsageError, match=r"--exclude '': matches nothing"):
        load_settings({"exclude": [""]})


def test_word_choices_are_taken_in_any_case(tmp_path, monkeypatch):
    """`--kv-dtype INT8` and KTCLI_MODE=FULL were refused, while `--device ' CPU '` was
    taken; each is kept in its one lower-case spelling."""
    use_config(tmp_path, monkeypatch, 'outline = "Always"\n')
    monkeypatch.setenv("KTCLI_MODE", "FULL")
    s = load_settings({"kv_dtype": "INT8", "attention": "TopK:4", "device": " CPU ", "engine": "KTCLI"})
    assert (s.mode, s.kv_dtype, s.attention, s.device, s.engine, s.outline) == \
        ("full", "int8", "topk:4", "cpu", "ktcli", "always")
    with pytest.raises(UsageError, match="--mode 'BOGUS': choose"):  # a refusal quotes what was typed
        load_settings({"mode": "BOGUS"})
    with pytest.raises(UsageError, match="--device ' GPU ': choose"):
        load_settings({"device": " GPU "})
    assert load_settings({"embed": "ALL"}).embed == "all"
    with pytest.raises(UsageError, match="--embed 'some': choose auto or all"):
        load_settings({"embed": "some"})



def test_a_config_number_past_a_floats_whole_numbers_is_refused(tmp_path, monkeypatch):
    """max_new_tokens = 1e30 was planned as an answer budget of
    1,000,000,000,000,000,019,884,624,838,656 tokens, float-to-int noise."""
    path = use_config(tmp_path, monkeypatch, "max_new_tokens = 1e30\n")
    with pytest.raises(UsageError, match=f"max_new_tokens in {re.escape(str(path))} 1e\\+30: not a whole number"):
        load_settings()
    use_config(tmp_path, monkeypatch, "max_new_tokens = 512.0\n")
    assert load_settings().max_new_tokens == 512


def test_an_api_key_flag_without_the_openai_backend_is_refused_but_serve_takes_it(tmp_path, monkeypatch):
    # `ktcli ask notes.md q --api-key KEY` was run by the local model, the key unused unsaid.
    # serve's --api-key is the key its own clients send: it stays.
    from ktcli.cli.common import Options

    use_config(tmp_path, monkeypatch, "")
    monkeypatch.delenv("KTCLI_BACKEND", raising=False)
    with pytest.raises(UsageError, match=re.escape("--api-key is the key of an OpenAI-compatible server, which "
                                                   "needs --backend openai")):
        Options({"api_key": "abc"}).settings()
    assert Options({"api_key": "abc"}).settings(serving=True).api_key == "abc"
    remote = Options({"api_key": "abc", "backend": "openai", "base_url": "http://h:8000/v1"}).settings()
    assert remote.api_key == "abc"
    monkeypatch.setenv("KTCLI_API_KEY", "from-env")  # the environment's, for runs that add --backend openai
    assert Options({}).settings().backend == "local"
