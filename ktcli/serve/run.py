"""Load the engine a `ktcli serve` command asks for, and serve it until interrupted."""

from __future__ import annotations

import inspect
import resource
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from ktcli.config import Settings
from ktcli.engine.batching import Runner, make_runner
from ktcli.engine.loading import weights_note
from ktcli.engine.model_store import ensure_hf_dir, loaded_repairing, resolve_model
from ktcli.errors import KtcliError, UsageError
from ktcli.plan.estimates import widths_workspace_bytes
from ktcli.serve.server import ServeApp, ServeOptions, check_exposure, make_server


def load_engine(settings: Settings, on_status: Callable[[str], None] | None = None):
    """The local backend, with the server-side options (KV dtype, attention policy)."""
    if settings.engine == "hf":
        if settings.kv_dtype != "auto" or settings.attention != "auto":
            raise UsageError("--kv-dtype and --attention need --engine ktcli")
        # transformers grows a cache per request: nothing to size (a config file's budget is
        # for `ktcli ask`'s plans, and left be)
        if settings.max_memory and "max_memory" not in dict(settings.origins):
            raise UsageError("--max-memory sizes the ktcli engine's KV pages: it needs --engine ktcli")
        from ktcli.engine.loading import load_backend

        return load_backend(replace(settings, backend="local"), on_status)
    if settings.engine != "ktcli":
        raise UsageError(f"--engine {settings.engine!r}: ktcli serve runs ktcli or hf")
    from ktcli.engine.native import NativeBackend
    from ktcli.engine.pack_cache import PACKED_DIR
    from ktcli.engine.threads import govern
    from ktcli.threads import cpu_sample

    source = resolve_model(settings.model, settings.named("model"))
    model_dir = ensure_hf_dir(source, settings.cache_path, on_status)
    if settings.attention not in ("", "auto"):  # a policy reading past the window answers noise
        from ktcli.engine.longctx import check_attention_span

        check_attention_span(model_dir, settings.attention, settings.rope_scaling or None)
    load_started = cpu_sample()
    # Clients asking several questions about one document send prompts that start alike:
    # the engine reads their K/V back from the prompt cache (engine.prefix_store).
    prompts = settings.cache_path / "prompts" if settings.prompt_cache else None
    budget = kv_budget(settings, model_dir)

    def load(folder):
        return NativeBackend.load(folder, device=settings.device, weights=settings.weights, threads=settings.threads,
                                  pack_cache=settings.cache_path / PACKED_DIR, prefix_cache=prompts,
                                  kv_budget_bytes=budget, **_engine_options(NativeBackend.load, settings))

    backend = loaded_repairing(source, model_dir, settings.cache_path, load, on_status)
    if budget is not None and backend.context_window < MIN_SERVED_TOKENS:
        raise UsageError(f"{settings.named('max_memory')} {settings.max_memory}: leaves KV pages for "
                         f"{backend.context_window:,} tokens (~{budget / 2**20:,.0f} MiB beside the model), under "
                         f"{MIN_SERVED_TOKENS:,}: give more")
    crowded = govern(backend.engine, settings.threads, load_started, settings.named("threads"))
    if crowded and on_status:
        on_status(crowded)
    return backend


# The fewest tokens a --max-memory budget must leave pages for: a chat's system prompt,
# a question and its answer.
MIN_SERVED_TOKENS = 1024


def kv_budget(settings: Settings, model_dir) -> int | None:
    """Bytes of KV pages under --max-memory: what is left of it after the runtime (on the
    CPU), the weights in the dtype loaded and a prefill chunk's activations; None without
    a budget (the engine's default: pages for a few windows, within a share of free
    memory). A server over quantized or sparse pages writes them all when it starts:
    `--attention topk:4` held 3.4 GiB before its first request, with nothing to bound it."""
    if not settings.max_memory:
        return None
    from ktcli.config import parse_bytes
    from ktcli.engine.config import load_config
    from ktcli.engine.device import resolve_device, resolve_weights
    from ktcli.engine.model_store import model_facts
    from ktcli.plan.estimates import CPU_RUNTIME_BYTES, FULL_PREFILL_CHUNK, WEIGHT_BYTES, workspace_bytes

    device = resolve_device(settings.device, settings.named("device"))
    facts = model_facts(resolve_model(settings.model, settings.named("model")), settings.cache_path)
    weights = resolve_weights(settings.weights, device, load_config(model_dir))
    held = int(facts.n_params * WEIGHT_BYTES.get(weights, 4.0)) + workspace_bytes(facts, FULL_PREFILL_CHUNK)
    if device.type == "cpu":
        held += CPU_RUNTIME_BYTES
    budget = parse_bytes(settings.max_memory)
    if budget <= held:
        raise UsageError(f"{settings.named('max_memory')} {settings.max_memory}: the model ({weights} weights) and the "
                         f"runtime take ~{held / 2**20:,.0f} MiB, leaving nothing for KV pages: give more")
    return budget - held


def _check_text_side(backend, warn: Callable[[str], None]) -> None:
    """A model folder without a tokenizer is refused before serving (it answered every
    request with a 500), and one without a chat template said (its chat requests are 400s;
    /v1/completions reads raw text)."""
    from ktcli.engine.tokenizer import NO_CHAT_TEMPLATE, ChatTemplateError, no_tokenizer

    if getattr(backend, "tokenizer", True) is None:  # our engine loads a folder without one, for tests
        raise UsageError(no_tokenizer(backend.model_dir))
    try:
        backend.chat_ids([{"role": "user", "content": "ping"}])
    except ChatTemplateError as e:
        if str(e).startswith(NO_CHAT_TEMPLATE):
            warn(f"{NO_CHAT_TEMPLATE} ({backend.model_dir}): /v1/chat/completions will answer 400, "
                 "/v1/completions works")
        else:  # a template that refuses this one message may take a client's conversation
            warn(f"{e} (a one-message conversation tried at start)")


def _engine_options(load: Callable, settings: Settings) -> dict:
    """Pass KV dtype and attention policy only as far as this engine build takes them."""
    accepted = inspect.signature(load).parameters
    options: dict = {}
    for name, value in (("kv_dtype", settings.kv_dtype), ("attention", settings.attention)):
        if value == "auto":
            continue
        if name not in accepted:
            raise UsageError(f"--{name.replace('_', '-')} {value}: this engine build does not take that option yet")
        options[name] = value
    return options


def serve(settings: Settings, options: ServeOptions, on_status: Callable[[str], None],
          runner: Runner | None = None, on_warn: Callable[[str], None] | None = None) -> None:
    check_listen(options.host, options.port)  # both before minutes of model loading
    check_exposure(options.host, options.api_key)
    if not options.model_id:
        options = replace(options, model_id=resolve_model(settings.model, settings.named("model")).name)
    # From the start, not once serving: a SIGTERM during the model's load ended the process
    # by the signal, with no word said.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if main else None
    # A server started in the background by a script (`ktcli serve &`) inherits SIGINT
    # ignored, and `kill -INT` left it serving: an interrupt asked for stops it, as Ctrl-C does.
    ignored_int = main and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored_int:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        started = time.perf_counter()
        if runner is None:
            on_status(f"loading model {settings.model} ({settings.engine} engine{weights_note(settings.weights)})")
            backend = load_engine(settings, on_status)
            _check_text_side(backend, on_warn or on_status)
            runner = make_runner(backend, options.max_batch)
        _serve_until_stopped(runner, options, on_status, time.perf_counter() - started)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if ignored_int:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _serve_until_stopped(runner: Runner, options: ServeOptions, on_status: Callable[[str], None],
                         load_s: float) -> None:
    app = ServeApp(runner, options)
    try:
        httpd = make_server(app)
    except OSError as e:
        raise UsageError(f"cannot listen on {options.host}:{options.port}: {e.strerror or e}") from None
    host, port = httpd.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host
    try:  # a SIGTERM from here on still closes the socket and stops the engine's thread
        app.scheduler.start()
        # What an operator sizes clients by: the longest request (prompt and answer) the
        # engine holds, the load time; and the machine by: the memory taken, now and with
        # every KV page in use.
        on_status(f"serving {options.model_id} on http://{shown}:{port}/v1 "
                  f"({runner.name} engine, batches of up to {app.scheduler.max_batch}, requests of up to "
                  f"{runner.context_window:,} tokens{_pages(runner)}{', API key required' if options.api_key else ''}"
                  f"{_browsers(options.cors_origins)}; "
                  f"loaded in {load_s:.1f}s, {_memory(runner, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)})")
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        app.scheduler.stop(wait_s=STOP_WAIT_S)
        app.drain(DRAIN_S)


def _pages(runner: Runner) -> str:
    """Our engine's KV pages, shared by every request at once (transformers grows a cache
    per request)."""
    tokens = getattr(runner, "kv_tokens", None)
    return f" and KV pages for {tokens:,} in all" if tokens else ""


def _memory(runner: Runner, peak_rss: int) -> str:
    """The memory the server takes: the peak RSS so far, and (our engine) what it comes to
    once its KV pages are all in use, which they bound. Float pages take memory only as
    requests write them, and what reads hold beside them comes with the first request:
    the line said "peak RSS 447 MiB" of a server that held 1.66 GiB after six 7.9K-token
    prompts (it now says ~1.62 GiB). Pages on a GPU are said apart: not in the RSS."""
    said = f"peak RSS {_size(peak_rss)}"
    pool = getattr(runner, "kv_bytes", 0)
    if not pool:  # transformers: a cache per request, as long as its prompt and answer
        return said
    if getattr(runner, "kv_device", "cpu") != "cpu":
        return f"{said}, and {_size(pool)} of KV pages in {runner.kv_device} memory"
    full = peak_rss + runner.kv_unwritten_bytes + _working_bytes(runner)
    return f"{said}, ~{_size(full)} with all {_size(pool)} of KV pages in use"


# What reads hold beyond their pages, none of it taken before the first request: measured
# (2026-12-07, SmolLM2 int8 on 2 cores, `ktcli serve` RSS) 351 MiB over one 7.9K-token
# prompt's pages, 403-530 MiB over the 4 windows' pages full (5-6 such prompts at once):
# 2.1-3.2x a prefill chunk's activations as the planner counts them
# (`plan.estimates.workspace_bytes`, 165 MiB here), so 3x.
READS_OVER_WORKSPACE = 3


def _working_bytes(runner: Runner) -> int:
    return READS_OVER_WORKSPACE * widths_workspace_bytes(runner.widths, runner.prefill_chunk)


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.0f} MiB"


def _browsers(origins: tuple[str, ...]) -> str:
    if not origins:
        return ""
    return ", browsers from any origin" if "*" in origins else f", browsers from {', '.join(origins)}"


# On Ctrl-C or SIGTERM the running batch is ended with an error and the engine thread is let finish
# its step (a prefill chunk takes seconds on a CPU) before the process exits.
STOP_WAIT_S = 60.0
DRAIN_S = 2.0  # then the clients in flight get their error ("the server is shutting down")


class Terminated(KtcliError):
    """SIGTERM (a service manager stopping the server): said in one line, as Ctrl-C is."""

    exit_code = 143


def _terminated(signum, frame) -> None:
    raise Terminated("terminated (SIGTERM)")


def check_listen(host: str, port: int) -> None:
    """The address can be listened on, found before the model loads (minutes for a big
    one): a busy port or a host that is no address here was reported after it."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise UsageError(f"--host {host}: not an address this machine can listen on ({e})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind(address)
        except OSError as e:
            raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
