"""Run the real `ktcli` in a subprocess, as a user would, with the real bundled models.

The converted model (GGUF -> safetensors, ~40 s once) is kept in a persistent test cache
shared by every test's otherwise empty cache, so only the first run on a machine pays it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import platformdirs
import pytest

from ktcli.engine.pack_cache import PACKED_DIR

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_docs"
PDF = SAMPLES / "harbor-light-annual-report-2023.pdf"
LONG_TEXT = SAMPLES / "python-tutorial-3.11.rst"
# Two CPU threads per ktcli process, as CI's 2-core machine has (one where there is one
# CPU: --threads above the CPUs is a usage error).
THREADS = str(min(2, len(os.sched_getaffinity(0))))
REPO = SAMPLES / "minirepo"


def shared_test_cache(name: str) -> Path:
    """The tests' persistent `name` folder (converted models, packed weights): made once a machine."""
    path = Path(os.environ.get("KTCLI_TEST_MODELS", platformdirs.user_cache_dir("ktcli-tests"))) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def fresh_cache(base: Path) -> Path:
    """An otherwise empty cache whose converted models and packed int8 weights are the
    tests' shared ones: packing SmolLM2 (152 MB written and synced) in every test's cache
    cost each CLI test seconds. Packed files are written whole under a temporary name and
    renamed, so no test reads a part of one."""
    cache = base / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    for name in ("models", PACKED_DIR):
        link = cache / name
        if not link.exists():
            link.symlink_to(shared_test_cache(name))
    return cache


def empty_config(folder: Path) -> Path:
    """An empty config file: the user's own config must not reach the tests."""
    path = folder / "no-config.toml"
    path.touch()
    return path


def run_ktcli(args: list[str], cache: Path, stdin: bytes | None = None, extra_env: dict | None = None,
              timeout: float = 600, stdout=None) -> subprocess.CompletedProcess:
    """ktcli in a subprocess with its own cache and an empty config; `stdout`: a file to
    write the answer to instead of capturing it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KTCLI_")}
    env.update({"KTCLI_CACHE_DIR": str(cache), "KTCLI_CONFIG": str(empty_config(cache)),
                "HF_HUB_OFFLINE": "1", "KTCLI_THREADS": THREADS})
    env.update(extra_env or {})
    outputs = {"capture_output": True} if stdout is None else {"stdout": stdout, "stderr": subprocess.PIPE}
    return subprocess.run([sys.executable, "-m", "ktcli.cli.app", *args], input=stdin, env=env, cwd=ROOT,
                          timeout=timeout, **outputs)


@pytest.fixture
def cache(tmp_path) -> Path:
    return fresh_cache(tmp_path)


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory) -> Path:
    return fresh_cache(tmp_path_factory.mktemp("module"))
