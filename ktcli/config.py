"""Settings, resolved as: command-line flags > KTCLI_* environment > config file > defaults.

The config file is TOML at $KTCLI_CONFIG or <user config dir>/ktcli/config.toml, with the
same keys as the Settings fields (e.g. `max_file_bytes = 2000000`).
"""

from __future__ import annotations

import decimal
import math
import os
import re
import stat
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import platformdirs

from ktcli.errors import UsageError


@dataclass(frozen=True)
class Settings:
    model: str = "smollm2"  # "smollm2" (bundled), a .gguf path, a HF folder or a cached repo id
    engine: str = "ktcli"  # "ktcli" (our engine) or "hf" (transformers: fallback and oracle)
    embedder: str = "minilm"  # bundled all-MiniLM-L6-v2, or a sentence-transformers folder
    mode: str = "auto"  # auto | full | retrieval | sparse
    cache_dir: str = ""  # empty: platformdirs user cache dir
    max_file_bytes: int = 2_000_000  # folder walks skip (and report) larger files
    # gitignore-style patterns folder walks leave out (reported in one line), relative to the
    # folder given; a file named on the command line is read whatever they say
    exclude: tuple[str, ...] = ()
    chunk_tokens: int = 256
    chunk_overlap: int = -1  # tokens shared by neighbouring chunks; -1: an eighth of chunk_tokens
    top_k: int = 8  # chunks retrieved for a question
    # sentences or table rows that best match a question, quoted again right before it
    # (pipeline.key_lines); 0: none
    key_lines: int = 2
    max_new_tokens: int = 384
    temperature: float = 0.0
    threads: int = 0  # 0: chosen by timing decode steps (engine.threads); N: fixed
    device: str = "auto"  # auto (cuda when torch sees a GPU, else cpu) | cpu | cuda (ktcli engine)
    weights: str = "auto"  # auto (int8 on CPU, bf16 on CUDA) | fp32 | bf16 | fp16 | int8 (engine weight dtype)
    kv_dtype: str = "auto"
    attention: str = "auto"
    rope_scaling: str = ""  # e.g. "yarn:4"; empty: the model config's (ktcli engine)
    max_memory: str = ""  # e.g. "4GB"; empty: a share of available RAM
    max_seconds: float = 0.0  # latency budget for the planner, 0: none
    # ktcli engine: keep prompts' K/V in cache_dir/prompts, read back by later questions
    # about the same input (engine.prefix_store); false: neither read nor write
    prompt_cache: bool = True
    # questions: embed every chunk (all), or, where more than EMBED_FOCUS_FROM are not in
    # the index cache yet, those the question's words point at (auto)
    embed: str = "auto"
    outline: str = "auto"  # summaries: read code and long prose as outlines: auto (over the time budget) | always | never
    backend: str = "local"  # "local" (load --engine in this process) or "openai" (a server)
    base_url: str = ""  # the OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1
    api_key: str = ""  # empty: $OPENAI_API_KEY, if set
    context_window: int = 0  # tokens; 0: what the server says (a smaller value caps it)
    request_timeout: float = 600.0  # seconds for one server request, retries included
    # Where values came from ("model in /home/u/.config/ktcli/config.toml", "KTCLI_MODEL"),
    # for errors found later (a model that is not there); a value absent here was a flag.
    origins: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)

    def named(self, name: str) -> str:
        """How an error names setting `name`: where it came from, else its flag."""
        return named_setting(self.origins, name)

    @property
    def overlap_tokens(self) -> int:
        """The chunk overlap in tokens: as set, or an eighth of the chunk (32 at the default
        256), so a smaller --chunk-tokens does not collide with a fixed default overlap."""
        return self.chunk_overlap if self.chunk_overlap >= 0 else self.chunk_tokens // 8

    @property
    def cache_path(self) -> Path:
        # "~" expanded: a config file's cache_dir = "~/.cache/x" made a folder named "~" here
        return Path(self.cache_dir).expanduser() if self.cache_dir else Path(platformdirs.user_cache_dir("ktcli"))


def named_setting(origins: tuple[tuple[str, str], ...], name: str) -> str:
    """Setting `name` as a message names it: where `origins` says it came from (KTCLI_MODE,
    "mode in ~/.config/ktcli/config.toml"), else its flag."""
    return dict(origins).get(name) or "--" + name.replace("_", "-")


def _coerce(name: str, raw: object, like: object, where: str = "") -> object:
    """`raw` as the type of the default `like`; `where` names the origin in the error."""
    try:
        if isinstance(like, bool):
            if isinstance(raw, bool):
                return raw
            word = str(raw).strip().lower()
            if word not in _TRUE | _FALSE:  # "maybe" read as false, unsaid
                raise ValueError(word)
            return word in _TRUE
        if isinstance(raw, bool):
            raise ValueError("a boolean")  # TOML's `true` is an int in Python: max_new_tokens = true was 1
        if isinstance(like, tuple):
            return _patterns(raw)
        if name in BYTE_SIZES and isinstance(raw, str):
            return parse_bytes(raw)  # "2.5MB", "3MiB", as --max-memory takes them
        if isinstance(like, int):
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError("a fraction")  # int(1.7) would quietly make it 1
            if isinstance(raw, float) and abs(raw) > _EXACT_FLOAT_INTS:
                # a config file's 1e30 was an answer budget of "1,000,000,000,000,000,019,884,624,838,656":
                # no whole number, as KTCLI_MAX_NEW_TOKENS=1e30 and the flag's 1e23 are not
                raise ValueError("past a float's whole numbers")
            return int(raw)  # type: ignore[arg-type]
        if isinstance(like, float):
            value = float(raw)  # type: ignore[arg-type]
            if not math.isfinite(value):  # "inf" seconds: printed as an "infs budget"
                raise ValueError(raw)
            return value
        return str(raw)
    except (TypeError, ValueError, OverflowError):
        what = {"int": "a whole number", "float": "a finite number", "bool": "true or false",
                "tuple": "a list of patterns"}.get(
            type(like).__name__, type(like).__name__) if name not in BYTE_SIZES else "a size above 0, like 2000000, 2.5MB or 3MiB"
        if where:  # named as validate() names a bad value: where it came from, then the value
            raise UsageError(f"{where} {raw!r}: not {what}") from None
        raise UsageError(f"--{name.replace('_', '-')} {raw}: not {what}") from None  # a flag


def _patterns(raw: object) -> tuple[str, ...]:
    """A list setting: a flag's or a config file's list of strings, or one string of
    comma-separated items (a KTCLI_* variable, a config file's `exclude = "*.csv"`)."""
    if isinstance(raw, str):
        return tuple(p.strip() for p in raw.split(",") if p.strip())
    if isinstance(raw, (list, tuple)) and all(isinstance(p, str) for p in raw):
        return tuple(raw)
    raise ValueError(raw)


# Past this a float holds no exact whole number (2**53).
_EXACT_FLOAT_INTS = 2**53
# Whole-number settings that are sizes in bytes: a unit may follow the number.
BYTE_SIZES = frozenset({"max_file_bytes"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


# KTCLI_* variables that are not settings: the config file's path, the traceback switch,
# the engine's own switches (A/B of its kernels, read where they act), set-up's torch pin
# and the test suite's. tests/test_config.py keeps this list equal to the sources' names.
OTHER_VARIABLES = frozenset({
    "KTCLI_CONFIG", "KTCLI_DEBUG", "KTCLI_PREFILL_DTYPE", "KTCLI_TORCH", "KTCLI_KERNELS", "KTCLI_ONEDNN",
    "KTCLI_NO_AMX_ATTENTION", "KTCLI_NO_AMX_GEMM", "KTCLI_NO_ROW_SPLIT", "KTCLI_NO_ATTN_KERNEL", "KTCLI_NO_AVX512",
    "KTCLI_NO_BF16_KERNEL", "KTCLI_NO_BLOCKED_PREFILL", "KTCLI_NO_CPP_KERNELS", "KTCLI_NO_CPU_MLP",
    "KTCLI_NO_FUSED_DECODE", "KTCLI_NO_INT8_KERNEL", "KTCLI_NO_MALLOPT", "KTCLI_NO_ONEDNN", "KTCLI_NO_PACK_CACHE",
    "KTCLI_SERVE_TEST_ENGINE", "KTCLI_TEST_CACHE", "KTCLI_TEST_MODELS",
})


def unknown_variables() -> list[str]:
    """A line ("KTCLI_TOPK is not a ktcli variable, ignored (KTCLI_TOP_K?)") for each
    KTCLI_* variable in the environment that nothing reads: a misspelled one was ignored
    without a word."""
    import difflib

    known = {f"KTCLI_{f.name.upper()}" for f in fields(Settings) if f.name != "origins"} | OTHER_VARIABLES
    out = []
    for name in sorted(k for k in os.environ if k.startswith("KTCLI_") and k not in known):
        close = difflib.get_close_matches(name, sorted(known), n=1)
        out.append(f"{name} is not a ktcli variable, ignored" + (f" ({close[0]}?)" if close else ""))
    return out


def unused_settings(settings: Settings) -> list[str]:
    """A line for a setting the environment or config file gives that this run cannot use:
    KTCLI_BASE_URL without --backend openai was ignored without a word (the flag is an
    error: `validate`)."""
    out = []
    if settings.backend == "local" and settings.base_url and "base_url" in dict(settings.origins):
        out.append(f"{settings.named('base_url')} is set but the backend is local: the local model answers "
                   "(--backend openai, or KTCLI_BACKEND=openai, asks that server)")
    return out


def config_file_path() -> Path:
    env = os.environ.get("KTCLI_CONFIG")
    return Path(env) if env else Path(platformdirs.user_config_dir("ktcli")) / "config.toml"


# No config is this long; a device named by mistake (/dev/zero) would be read forever.
MAX_CONFIG_BYTES = 1 << 20


def _config_text(path: Path, named: bool) -> str | None:
    """The config file's text, or None where there is none. Whatever can be read is read,
    not only a regular file: KTCLI_CONFIG=/dev/null (no config, as usual for a Unix tool)
    and a FIFO such as bash's <(echo 'top_k = 3') were refused as "no such file".
    `named`: the user named it (KTCLI_CONFIG), so its absence is an error."""
    if not path.exists() or path.is_dir():
        if named:  # a file the user named and we cannot read must not leave them on the defaults unawares
            raise UsageError(f"KTCLI_CONFIG={path}: {'a folder, not a file' if path.is_dir() else 'no such file'}")
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise UsageError(f"config file {path}: {e.strerror or e}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UsageError(f"config file {path}: over {MAX_CONFIG_BYTES >> 20} MiB, which no config file is")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"config file {path}: not UTF-8 text (byte {e.start:,}); TOML files are UTF-8") from None


def load_settings(flags: dict[str, object] | None = None) -> Settings:
    """Defaults, overlaid by the config file, then KTCLI_* variables, then non-None flags."""
    base = Settings()
    known = {f.name: getattr(base, f.name) for f in fields(Settings) if f.name != "origins"}
    values: dict[str, object] = {}

    origins: dict[str, str] = {}  # where each value came from, for the errors that name it
    path = config_file_path()
    text = _config_text(path, named=bool(os.environ.get("KTCLI_CONFIG")))
    if text is not None:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"config file {path}: {e}") from None
        for key, raw in data.items():
            if key not in known:
                import difflib

                close = difflib.get_close_matches(key, sorted(known), n=1)
                raise UsageError(f"config file {path}: unknown setting {key!r}" + (f" ({close[0]}?)" if close else ""))
            values[key] = _coerce(key, raw, known[key], f"{key} in {path}")
            origins[key] = f"{key} in {path}"
        cache_dir = str(values.get("cache_dir", ""))
        if cache_dir and not Path(cache_dir).expanduser().is_absolute() and path.is_file():  # (not <(echo ...))
            # beside the file that names it, not wherever a command is run from: a cron job's
            # runs from two folders made two caches (and converted the model twice)
            # (the folder as named, links not followed: a config linked in from a dotfiles
            # repository would put gigabytes of models into it)
            values["cache_dir"] = str(Path(os.path.abspath(Path(path).expanduser())).parent / cache_dir)

    for key, like in known.items():
        raw = os.environ.get(f"KTCLI_{key.upper()}")
        if raw is not None and raw != "":
            values[key] = _coerce(key, raw, like, f"KTCLI_{key.upper()}")
            origins[key] = f"KTCLI_{key.upper()}"

    for key, raw in (flags or {}).items():
        if key == "cache_dir" and raw == "":
            # taken for "the default" it also overrode KTCLI_CACHE_DIR: a run wrote elsewhere
            raise UsageError("--cache-dir is empty: name a folder, or leave the option out")
        if raw is not None:
            values[key] = _coerce(key, raw, known[key])
            origins.pop(key, None)  # a flag: named as the flag

    return validate(replace(base, **values), origins)


# What the string settings accept. KV_DTYPES mirrors kernels.layout.KV_KINDS (config
# imports no torch; tests/test_config.py keeps the two equal).
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "int4")
ATTENTION_KINDS = ("dense", "window", "topk")
ROPE_KINDS = ("linear", "dynamic", "yarn", "llama3")
_CHOICES = {
    "engine": ("ktcli", "hf"),
    "backend": ("local", "openai"),
    "mode": ("auto", "full", "sparse", "retrieval"),
    "weights": ("auto", "fp32", "bf16", "fp16", "int8"),
    "kv_dtype": ("auto",) + KV_DTYPES,
    "outline": ("auto", "always", "never"),
    "embed": ("auto", "all"),
}
# --embed auto: a question about an input with more than EMBED_FOCUS_FROM chunks not in
# the index cache embeds the EMBED_FOCUS_CHUNKS its words point at (`retrieval.retriever`)
EMBED_FOCUS_FROM = 1500
EMBED_FOCUS_CHUNKS = 1000
# KTCLI_PREFILL_DTYPE (an engine variable, not a setting: engine.device.resolve_prefill_dtype)
PREFILL_DTYPES = ("auto", "fp32", "bf16")
# Lowest allowed value of the numeric settings (request_timeout: above it; chunk_tokens, and
# a set overlap against it, below in `validate`, and again by ingest.chunking for callers
# that chunk without settings).
_AT_LEAST = {"chunk_overlap": -1, "max_new_tokens": 1, "top_k": 1, "key_lines": 0, "max_file_bytes": 1, "threads": 0, "context_window": 0,
             "max_seconds": 0.0, "temperature": 0.0}


# The sparse policies' page counts when --attention names none (engine.longctx.make_policy).
DEFAULT_TOPK_PAGES = 8
DEFAULT_LOCAL_PAGES = 4


def canonical_attention(spec: str) -> str:
    """'topk' -> 'topk:8', 'window:4' stays, 'dense' / 'auto' / '' -> 'dense': one spelling
    per policy, for matching what the prompt cache holds (`engine.prefix_store`)."""
    if spec in ("", "auto", "dense"):
        return "dense"
    try:
        kind, pages = parse_attention(spec)
    except ValueError:
        return spec  # refused where settings are checked; nothing held matches it
    if kind == "dense":
        return "dense"
    return f"{kind}:{pages or (DEFAULT_TOPK_PAGES if kind == 'topk' else DEFAULT_LOCAL_PAGES)}"


def canonical_rope_scaling(spec: str) -> str:
    """'yarn:2.0' -> 'yarn:2', 'none' / '' -> '': one spelling per scaling."""
    parsed = parse_rope_scaling(spec) if spec else None
    return f"{parsed[0]}:{parsed[1]:g}" if parsed else ""


def parse_attention(spec: str) -> tuple[str, int | None]:
    """'topk', 'topk:16', 'window:8', 'dense' -> (kind, pages or None); ValueError if not."""
    kind, sep, pages = spec.partition(":")
    if kind not in ATTENTION_KINDS:
        raise ValueError(f"--attention {spec!r}: choose one of {', '.join(ATTENTION_KINDS)} (topk:N / window:N set the pages)")
    if not sep:
        return kind, None
    if kind == "dense":
        raise ValueError(f"--attention {spec!r}: dense reads every page and takes no count; topk:N and window:N do")
    if not pages.isdigit() or int(pages) < 1:
        raise ValueError(f"--attention {spec!r}: give a page count of at least 1, e.g. topk:16 or window:8")
    return kind, int(pages)


NEEDS_BASE_URL = ("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1), KTCLI_BASE_URL or base_url in "
                  "the config file")


# 1024 x an 8K window is 8M positions, far past any input ktcli reads; an infinite factor
# made every position the same and the answer empty.
MAX_ROPE_FACTOR = 1024


def parse_rope_scaling(spec: str) -> tuple[str, float] | None:
    """'yarn:4', 'linear' (factor 2) -> (kind, factor); 'none' / 'default' -> None (the
    model's own RoPE); ValueError if not."""
    kind, _, factor = spec.partition(":")
    kind = kind.strip().lower()
    if kind in ("none", "default"):
        return None
    if kind not in ROPE_KINDS:
        raise ValueError(f"--rope-scaling {spec!r}: give {'|'.join(ROPE_KINDS)}[:factor], e.g. yarn:4")
    try:
        f = float(factor) if factor else 2.0
    except ValueError:
        raise ValueError(f"--rope-scaling {spec!r}: the factor must be a number") from None
    if not 1 <= f <= MAX_ROPE_FACTOR:  # also rejects nan and inf
        raise ValueError(f"--rope-scaling {spec!r}: the factor must be from 1 to {MAX_ROPE_FACTOR}")
    return kind, f


def _as_typed(value: float | int) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _canonical_spelling(settings: Settings) -> Settings:
    """The word settings in their one lower-case spelling where that is a choice: `--kv-dtype
    INT8` and `KTCLI_MODE=FULL` were refused, while `--device ' CPU '` was taken. What no
    spelling makes a choice is left as typed, for its error to quote."""
    changes = {}
    for name, choices in _CHOICES.items():
        value = getattr(settings, name)
        if value.strip().lower() in choices:
            changes[name] = value.strip().lower()
    attention = settings.attention.strip().lower()
    try:
        if attention == "auto" or parse_attention(attention):
            changes["attention"] = attention
    except ValueError:
        pass
    device = settings.device.strip().lower()
    if _valid_device(device):
        changes["device"] = device
    return replace(settings, **changes)


def _valid_device(device: str) -> bool:
    return device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", device) is not None


def validate(settings: Settings, origins: dict[str, str] | None = None) -> Settings:
    """Reject values no command can use, before any work starts (a dry-run `plan` never
    loads the engine, which would otherwise be the first to notice). `origins`: where
    each value came from, as the error should name it (`load_settings`); a flag's name
    otherwise."""
    if origins:
        settings = replace(settings, origins=tuple(origins.items()))
    settings = _canonical_spelling(settings)
    named = settings.named

    for name, choices in _CHOICES.items():
        value = getattr(settings, name)
        if value not in choices:
            raise UsageError(f"{named(name)} {value!r}: choose {', '.join(choices[:-1])} or {choices[-1]}")
    for name, low in _AT_LEAST.items():
        value = getattr(settings, name)
        if not value >= low:
            # as typed: "--max-seconds -3", not the float's "-3.0 ... at least 0.0"
            raise UsageError(f"{named(name)} {_as_typed(value)}: must be at least {_as_typed(low)}")
    if settings.temperature > MAX_TEMPERATURE:  # as OpenAI's API and `ktcli serve` bound it
        raise UsageError(f"{named('temperature')} {settings.temperature}: must be at most {MAX_TEMPERATURE}")
    if settings.threads > usable_cpus():
        raise UsageError(f"{named('threads')} {settings.threads}: this process may use {usable_cpus()} CPUs "
                         "(more threads than CPUs only wait on each other)")
    if settings.chunk_tokens < 1:
        raise UsageError(f"{named('chunk_tokens')} {settings.chunk_tokens}: must be at least 1")
    if settings.chunk_overlap >= settings.chunk_tokens:
        raise UsageError(f"{named('chunk_overlap')} {settings.chunk_overlap}: must be below the chunk size "
                         f"({settings.chunk_tokens})")
    for pattern in settings.exclude:
        # what git's own parser drops without a word (ingest.gitignore.exclude_rules checks the rest)
        if not pattern.strip() or pattern.startswith("#"):
            raise UsageError(f"{named('exclude')} {pattern!r}: {EXCLUDE_MATCHES_NOTHING}")
    if settings.request_timeout <= 0:
        raise UsageError(f"{named('request_timeout')} {settings.request_timeout}: must be above 0")
    if not _valid_device(settings.device):
        # the engine said it too, but only after the input was read or the server started loading
        raise UsageError(f"{named('device')} {settings.device!r}: choose auto, cpu, cuda or cuda:N")
    if settings.max_memory:
        try:
            size = parse_bytes(settings.max_memory)
        except ValueError:
            raise UsageError(f"{named('max_memory')} {settings.max_memory!r}: give a size like 4GB or 512MiB") from None
        if size < 1 << 20:  # "--max-memory 1" was planned as 1 byte: a unit left out, not a budget
            raise UsageError(f"{named('max_memory')} {settings.max_memory!r} is {size:,} byte{'s' if size != 1 else ''}, under 1 MiB: "
                             "give a size like 4GB or 512MiB")
    if settings.engine == "hf" and settings.backend == "local":
        # transformers runs its own dense cache in fp32 or bf16: nothing of ours to shape
        if settings.weights not in ("auto", "fp32", "bf16"):
            raise UsageError(f"{named('weights')} {settings.weights!r}: the transformers engine (--engine hf) "
                             "runs fp32 or bf16 weights")
        for name, idle in (("kv_dtype", ("auto",)), ("attention", ("auto", "dense")), ("rope_scaling", ("",))):
            if getattr(settings, name) not in idle:
                raise UsageError(f"{named(name)} {getattr(settings, name)!r}: the transformers engine (--engine hf) "
                                 "has no paged KV cache of ours to apply it to; use --engine ktcli")
    if settings.backend == "local" and settings.base_url and "base_url" not in origins:
        # given as a flag and silently unused: the local model would answer instead
        raise UsageError(f"--base-url {settings.base_url}: it names an OpenAI-compatible server, which needs "
                         "--backend openai as well")
    if settings.backend == "openai" and not settings.base_url:  # said before the input is read
        raise UsageError(NEEDS_BASE_URL)
    if settings.backend == "openai":
        # the server holds the model and its cache: nothing here to load or shape
        for name, idle in (("weights", ("auto",)), ("kv_dtype", ("auto",)), ("attention", ("auto", "dense")),
                           ("rope_scaling", ("",)), ("mode", ("auto", "full", "retrieval"))):
            if getattr(settings, name) not in idle:
                raise UsageError(f"{named(name)} {getattr(settings, name)!r}: an OpenAI-compatible server "
                                 "(--backend openai) keeps its own weights and KV cache; use --backend local")
    prefill = (os.environ.get("KTCLI_PREFILL_DTYPE") or "auto").strip().lower()
    if prefill not in PREFILL_DTYPES:  # read by the engine, after the model loads: checked here so plan sees it
        raise UsageError(f"KTCLI_PREFILL_DTYPE={prefill!r}: choose {', '.join(PREFILL_DTYPES)}")
    if settings.cache_dir:
        _check_cache_dir(settings.cache_dir, named("cache_dir"))
    for name, parse in (("attention", parse_attention), ("rope_scaling", parse_rope_scaling)):
        value = getattr(settings, name)
        if value and value != "auto":
            try:
                parse(value)
            except ValueError as e:
                raise UsageError(str(e).replace(f"--{name.replace('_', '-')}", named(name), 1)) from None
    return settings


def _check_cache_dir(cache_dir: str, name: str) -> None:
    """A folder, or one that can be made: checked without making it, since validation also
    runs for `ktcli plan`, a dry run (the writers make what they need)."""
    cache = Path(cache_dir).expanduser()
    try:
        is_dir = stat.S_ISDIR(os.stat(cache).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_dir = None  # not there (yet)
    except OSError as e:
        # A symbolic link to itself (or a loop above it): exists() said no and its parent
        # was writable, so `plan` said nothing and `ask` read its input before failing
        # to convert the model into it.
        raise UsageError(f"{name} {cache_dir}: cannot use it ({e.strerror or e})") from None
    if is_dir is not None:
        if not is_dir:
            raise UsageError(f"{name} {cache_dir}: not a folder")
        return
    if cache.is_symlink():  # to nothing: no folder can be made through it
        raise UsageError(f"{name} {cache_dir}: a symbolic link to {os.readlink(cache)}, which does not exist")
    ancestor = cache.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UsageError(f"{name} {cache_dir}: cannot create it ({ancestor} is not a folder)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"{name} {cache_dir}: cannot create it ({ancestor} is not writable)")


MAX_TEMPERATURE = 2.0
EXCLUDE_MATCHES_NOTHING = ("matches nothing; give a pattern such as 'tests/fixtures/**' or '*.csv' "
                           "(a name that starts with '#' is written '\\#')")


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity calls (macOS)
        return os.cpu_count() or 1


def parse_bytes(text: str) -> int:
    """'4GB', '512MiB', '1e9', '2.01MB' -> bytes, exactly (in decimal: float arithmetic
    made 2.01MB 2,009,999). Raises ValueError on nonsense and on a fraction of a byte
    ('1.5' was 1, silently)."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9}
    raw = text.strip().upper().replace(" ", "")
    number = raw.rstrip("KMGTIB")
    unit = raw[len(number):]
    if unit not in units or not number:
        raise ValueError(text)
    try:
        value = decimal.Decimal(number) * units[unit]
    except decimal.InvalidOperation:
        raise ValueError(text) from None
    if not value.is_finite() or value <= 0 or value > 2**63:  # "inf", "1e999GB", "-1GB"
        raise ValueError(text)
    if unit in ("", "B") and value != value.to_integral_value():
        raise ValueError(f"{text}: a fraction of a byte")
    return int(value.to_integral_value(decimal.ROUND_HALF_UP))
