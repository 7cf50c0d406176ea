"""Start `ktcli serve` as a real subprocess on a free loopback port, and run the CLI."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.conftest import ROOT, THREADS, empty_config, fresh_cache

# Our engine by default (what `ktcli serve` is for); KTCLI_SERVE_TEST_ENGINE=hf runs the
# same tests over transformers.
ENGINE = os.environ.get("KTCLI_SERVE_TEST_ENGINE", "ktcli")
READY = re.compile(r"serving (\S+) on http://127\.0\.0\.1:(\d+)/v1")


def cli_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KTCLI_", "OPENAI_"))}
    env.update({"KTCLI_CACHE_DIR": str(cache), "KTCLI_CONFIG": str(empty_config(cache)),
                "HF_HUB_OFFLINE": "1", "KTCLI_THREADS": THREADS, "NO_COLOR": "1"})
    return env


def run_cli(args: list[str], base: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ktcli.cli.app", *args], capture_output=True, text=True,
                          env=cli_env(fresh_cache(base)), cwd=ROOT, timeout=timeout)


class Served:
    """A running `ktcli serve`; `stop()` kills it (SIGKILL when `hard`)."""

    def __init__(self, proc: subprocess.Popen, port: int, model: str, log: Path) -> None:
        self.proc, self.port, self.model, self.log = proc, port, model, log
        self.url = f"http://127.0.0.1:{port}/v1"

    def stop(self, hard: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if hard else self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)

    def alive(self) -> bool:
        return self.proc.poll() is None


def start_serve(base: Path, *extra: str, engine: str = ENGINE, timeout: float = 240,
                sigint: signal.Handlers = signal.SIG_DFL) -> Served:
    cache = fresh_cache(base)
    log = base / "serve.log"
    cmd = [sys.executable, "-m", "ktcli.cli.app", "serve", "--port", "0", "--engine", engine, *extra]
    with open(log, "w") as err:
        # SIGINT as a terminal's: a suite started in the background by a shell without job
        # control inherits it ignored, and the server then never saw the Ctrl-C test's.
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=cli_env(cache), cwd=ROOT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, sigint))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = READY.search(log.read_text())
        if found:
            return Served(proc, int(found.group(2)), found.group(1), log)
        if proc.poll() is not None:
            raise RuntimeError(f"ktcli serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"ktcli serve did not start within {timeout}s: {log.read_text()[-2000:]}")


def request(port: int, method: str, path: str, body: bytes | dict | None = None, key: str | None = None,
            timeout: float = 300) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    try:
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else {}
    finally:
        conn.close()
