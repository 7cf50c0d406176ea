"""Settings, resolved as: command-line flags > KTCLI_* environment > config file > defaults.

The config file is TOML at $KTCLI_CONFIG or <user config dir>/ktcli/config.toml, with the
same keys as the Settings fields (e.g. `max_file_bytes = 2000000`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
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
    chunk_tokens: int = 256
    chunk_overlap: int = 32
    top_k: int = 8  # chunks retrieved for a question
    max_new_tokens: int = 384
    temperature: float = 0.0
    threads: int = 0  # 0: torch's default
    device: str = "auto"  # auto (cuda when torch sees a GPU, else cpu) | cpu | cuda (ktcli engine)
    weights: str = "auto"  # auto (int8 on CPU, bf16 on CUDA) | fp32 | bf16 | fp16 | int8 (engine weight dtype)
    kv_dtype: str = "auto"
    attention: str = "auto"
    rope_scaling: str = ""  # e.g. "yarn:4"; empty: the model config's (ktcli engine)
    max_memory: str = ""  # e.g. "4GB"; empty: a share of available RAM
    max_seconds: float = 0.0  # latency budget for the planner, 0: none
    backend: str = "local"  # "local" (load --engine in this process) or "openai" (a server)
    base_url: str = ""  # the OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1
    api_key: str = ""  # empty: $OPENAI_API_KEY, if set
    context_window: int = 0  # tokens; 0: what the server says (a smaller value caps it)
    request_timeout: float = 600.0  # seconds for one server request, retries included

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else Path(platformdirs.user_cache_dir("ktcli"))


def _coerce(name: str, raw: object, like: object) -> object:
    try:
        if isinstance(like, bool):
            return raw if isinstance(raw, bool) else str(raw).lower() in {"1", "true", "yes", "on"}
        if isinstance(like, int):
            return int(raw)  # type: ignore[arg-type]
        if isinstance(like, float):
            return float(raw)  # type: ignore[arg-type]
        return str(raw)
    except (TypeError, ValueError):
        raise UsageError(f"setting {name!r}: cannot read {raw!r} as {type(like).__name__}") from None


def config_file_path() -> Path:
    env = os.environ.get("KTCLI_CONFIG")
    return Path(env) if env else Path(platformdirs.user_config_dir("ktcli")) / "config.toml"


def load_settings(flags: dict[str, object] | None = None) -> Settings:
    """Defaults, overlaid by the config file, then KTCLI_* variables, then non-None flags."""
    base = Settings()
    known = {f.name: getattr(base, f.name) for f in fields(Settings)}
    values: dict[str, object] = {}

    path = config_file_path()
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise UsageError(f"config file {path}: {e}") from None
        for key, raw in data.items():
            if key not in known:
                raise UsageError(f"config file {path}: unknown setting {key!r}")
            values[key] = _coerce(key, raw, known[key])

    for key, like in known.items():
        raw = os.environ.get(f"KTCLI_{key.upper()}")
        if raw is not None and raw != "":
            values[key] = _coerce(key, raw, like)

    for key, raw in (flags or {}).items():
        if raw is not None:
            values[key] = _coerce(key, raw, known[key])

    return replace(base, **values)
