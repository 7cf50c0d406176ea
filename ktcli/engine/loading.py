"""Pick and load the generation backend a request asks for."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from ktcli.config import Settings
from ktcli.engine.backend import Backend
from ktcli.engine.model_store import ensure_hf_dir, loaded_repairing, resolve_model
from ktcli.errors import UsageError

ENGINES = ("ktcli", "hf")
# Work a load does once per install or model (compiling the C++ kernels, measuring int4
# key weights) is said when it has taken this long, where it cannot be known beforehand.
ANNOUNCE_AFTER_S = 3.0
# Seconds of such work in this process's last load: not a load's own time, so not what
# plans learn as one (a 41 s compile made the next plans say ~21 s for a 2 s answer).
one_time_s = 0.0


def load_backend(settings: Settings, on_status: Callable[[str], None] | None = None, plan=None,
                 on_warning: Callable[[str], None] | None = None) -> Backend:
    """The backend for `settings`; a Plan's KV dtype and attention policy (sparse mode,
    or a --kv-dtype/--attention the plan kept) shape the native engine's cache.
    `on_warning` (else `on_status`) hears what the user must not miss: a --threads the
    other processes leave no cores for."""
    if settings.backend == "openai":
        from ktcli.engine.openai_backend import OpenAIBackend

        return OpenAIBackend.from_settings(settings)
    if settings.backend != "local":
        raise UsageError(f"--backend {settings.backend!r}: choose local or openai")
    source = resolve_model(settings.model, settings.named("model"))
    model_dir = ensure_hf_dir(source, settings.cache_path, on_status)
    backend = loaded_repairing(source, model_dir, settings.cache_path,
                               lambda folder: _load_local(settings, folder, on_status, plan, on_warning), on_status)
    if settings.context_window and settings.context_window < backend.context_window:
        backend.context_window = settings.context_window  # --context-window caps what prompts may fill
    return backend


def _load_local(settings: Settings, model_dir, on_status: Callable[[str], None] | None, plan,
                on_warning: Callable[[str], None] | None = None) -> Backend:
    backend: Backend
    if settings.engine == "hf":
        from ktcli.engine.gguf_weights import linked_gguf
        from ktcli.engine.hf_backend import HFBackend

        if linked_gguf(model_dir) is not None and on_status:  # (HFBackend writes it)
            on_status("writing the model's weights as float32 for --engine hf (once)")

        # The transformers fallback runs on the CPU, in fp32 unless asked otherwise.
        dtype = "fp32" if settings.weights in ("", "auto") else settings.weights
        backend = HFBackend(model_dir, threads=settings.threads, dtype=dtype)
    elif settings.engine == "ktcli":
        from ktcli.engine import key_calibration
        from ktcli.engine.device import device_kind
        from ktcli.engine.native import NativeBackend  # type: ignore[import-not-found]
        from ktcli.engine.pack_cache import PACKED_DIR
        from ktcli.engine.threads import govern
        from ktcli.threads import cpu_sample

        global one_time_s
        one_time_s = 0.0
        if device_kind(settings.device, settings.named("device")) == "cpu":  # a GPU run uses none of them
            _build_kernels(on_status)
        load_started = cpu_sample()
        prompts = settings.cache_path / "prompts" if settings.prompt_cache else None
        long_context = _long_context(settings, plan)
        if "attention" in long_context:  # a policy reading past the window answers noise: said before the load
            from ktcli.engine.longctx import check_attention_span

            check_attention_span(model_dir, long_context["attention"], long_context.get("rope_scaling"))
        measures = long_context.get("kv_dtype") == "int4" and not key_calibration.is_kept(
            model_dir, settings.cache_path / PACKED_DIR)
        with (_one_time_work(on_status, "measuring where this model's queries look, for its int4 keys (once, "
                                        "a few seconds)", known=True) if measures else contextlib.nullcontext()):
            backend = NativeBackend.load(model_dir, device=settings.device, weights=settings.weights,
                                         threads=settings.threads, pack_cache=settings.cache_path / PACKED_DIR,
                                         prefix_cache=prompts, **long_context)
        crowded = govern(backend.engine, settings.threads, load_started, settings.named("threads"))
        if crowded and (on_warning or on_status):
            (on_warning or on_status)(crowded)
        _report_missing_kernels(on_status)
    else:
        raise UsageError(f"--engine {settings.engine!r}: choose one of {', '.join(ENGINES)}")
    return backend


def _build_kernels(on_status: Callable[[str], None] | None) -> None:
    """Load the C++ kernels before the model: the first load after an install compiles
    them (`scripts/setup.sh` does it ahead of time), and so does one whose build folder is
    stale (another path, another compiler), which no file says beforehand: said, not a
    silent minute on "loading model"."""
    import os

    from ktcli.engine import cpp_ext

    if os.environ.get("KTCLI_NO_CPP_KERNELS"):
        return
    with _one_time_work(on_status, "compiling the engine's C++ kernels (once: about a minute, more on a busy machine)",
                        known=cpp_ext.needs_build()):
        cpp_ext.load()


@contextlib.contextmanager
def _one_time_work(on_status: Callable[[str], None] | None, message: str, known: bool):
    """Say `message` at once where the work is `known` to happen, else once it has taken
    ANNOUNCE_AFTER_S; its seconds go to `one_time_s` where it was known or took that long."""
    global one_time_s
    timer = None
    if on_status and known:
        on_status(message)
    elif on_status:
        timer = threading.Timer(ANNOUNCE_AFTER_S, on_status, (message,))
        timer.daemon = True
        timer.start()
    started = time.perf_counter()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
        took = time.perf_counter() - started
        if known or took > ANNOUNCE_AFTER_S:
            one_time_s += took


def _report_missing_kernels(on_status: Callable[[str], None] | None) -> None:
    """Said where the C++ kernels could not be built (no compiler, a build folder that
    cannot be written): the torch path is several times slower (decode 15 against 65
    tok/s), which went unexplained."""
    from ktcli.engine import cpp_ext

    if on_status and cpp_ext.unavailable:
        on_status(f"the engine's C++ kernels are unavailable ({cpp_ext.unavailable[0]}): "
                  "running its slower torch path; TORCH_EXTENSIONS_DIR sets where they are built")


def _long_context(settings: Settings, plan) -> dict:
    """NativeBackend.load options for the plan's KV dtype and attention policy."""
    kv_dtype = getattr(plan, "kv_dtype", "model")
    attention = getattr(plan, "attention", "dense")
    out: dict = {}
    if kv_dtype not in ("model", "auto", ""):
        out["kv_dtype"] = kv_dtype
    if attention not in ("auto", "", "dense"):
        out["attention"] = attention
    if settings.rope_scaling:
        out["rope_scaling"] = settings.rope_scaling
    if plan is not None:
        out["kv_windows"] = 1  # one request: pages for one window, not `ktcli serve`'s several
    if plan is not None and getattr(plan, "context_window", 0):
        # The plan's window (the pages are sized to it): for a sparse read the whole input,
        # the answer and a margin; otherwise the model's. Without it a remapped policy's
        # cache is sized for 32K tokens (a full read of the README's PDF with int4 pages and
        # topk held 272 MB of pages for 2.6K tokens).
        out["context_window"] = plan.context_window
    if plan is not None and getattr(plan, "kv_window", 0):
        # A read in parts: pages for what one of its reads puts in the window (`Plan.kv_window`)
        out["context_window"] = plan.kv_window
    return out


def weights_note(weights: str | None) -> str:
    """', bf16' for the "loading model" status line; nothing for auto (the engine picks the
    dtype from the device once it has one, which the status line comes before)."""
    return "" if weights in (None, "", "auto") else f", {weights}"


def _prepare() -> int:
    """`python -m ktcli.engine.loading` (scripts/setup.sh): convert the configured model
    and, for the ktcli engine's int8 weights, pack them into the cache now, so the first
    question does not wait ~40 s for it. One line on stderr either way; never a traceback."""
    import sys
    import time

    from ktcli.config import load_settings
    from ktcli.errors import KtcliError

    started = time.perf_counter()
    try:
        settings = load_settings()
        load_backend(settings, on_status=lambda msg: print(f"model: {msg}", file=sys.stderr, flush=True))
    except (KtcliError, OSError) as e:
        print(f"model: not prepared now ({e}); the first question will do it", file=sys.stderr)
        return 1
    print(f"model: {settings.model} ready ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(_prepare())
