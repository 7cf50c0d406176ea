"""Pick and load the generation backend a request asks for."""

from __future__ import annotations

from collections.abc import Callable

from ktcli.config import Settings
from ktcli.engine.backend import Backend
from ktcli.engine.model_store import ensure_hf_dir, resolve_model
from ktcli.errors import UsageError

ENGINES = ("ktcli", "hf")


def load_backend(settings: Settings, on_status: Callable[[str], None] | None = None) -> Backend:
    if settings.backend == "openai":
        from ktcli.engine.openai_backend import OpenAIBackend

        return OpenAIBackend.from_settings(settings)
    if settings.backend != "local":
        raise UsageError(f"--backend {settings.backend!r}: choose local or openai")
    source = resolve_model(settings.model)
    model_dir = ensure_hf_dir(source, settings.cache_path, on_status)
    if settings.engine == "hf":
        from ktcli.engine.hf_backend import HFBackend

        return HFBackend(model_dir, threads=settings.threads, dtype=settings.weights)
    if settings.engine == "ktcli":
        from ktcli.engine.native import NativeBackend  # type: ignore[import-not-found]

        return NativeBackend.load(model_dir, weights=settings.weights, threads=settings.threads)
    raise UsageError(f"--engine {settings.engine!r}: choose one of {', '.join(ENGINES)}")
