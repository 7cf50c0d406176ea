"""`python -m ktcli.engine.loading` (run by scripts/setup.sh): converts and packs the
configured model into the cache so the first question does not wait for it; where it cannot,
one line on stderr and exit 1, never a traceback (set-up goes on)."""

import os
import subprocess
import sys

from ktcli.engine import pack_cache


def _run(**env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ktcli.engine.loading"], env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
                          capture_output=True, text=True, timeout=600)


def test_a_missing_model_is_one_line_and_exit_1(tmp_path):
    out = _run(KTCLI_MODEL=str(tmp_path / "missing.gguf"), KTCLI_CACHE_DIR=str(tmp_path / "cache"))
    assert out.returncode == 1
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("model: not prepared now") and "Traceback" not in out.stderr


def test_a_model_folder_is_packed_into_the_cache(tiny_models, tmp_path):
    cache = tmp_path / "cache"
    out = _run(KTCLI_MODEL=str(tiny_models["llama"]), KTCLI_CACHE_DIR=str(cache), KTCLI_DEVICE="cpu")
    assert out.returncode == 0, out.stderr[-2000:]
    assert pack_cache.cache_file(cache / "packed", tiny_models["llama"]).is_file()
