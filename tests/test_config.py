import pytest

from ktcli.config import load_settings
from ktcli.errors import UsageError


def test_precedence_flags_over_env_over_file(tmp_path, monkeypatch):
    cfg = tmp_path / "config.toml"
    cfg.write_text('top_k = 3\nmodel = "from-file"\nchunk_tokens = 128\n')
    monkeypatch.setenv("KTCLI_CONFIG", str(cfg))
    monkeypatch.setenv("KTCLI_TOP_K", "5")
    monkeypatch.setenv("KTCLI_MODEL", "from-env")
    s = load_settings({"model": "from-flag", "top_k": None})
    assert s.model == "from-flag"
    assert s.top_k == 5
    assert s.chunk_tokens == 128


def test_cache_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KTCLI_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("KTCLI_CACHE_DIR", str(tmp_path / "c"))
    assert load_settings().cache_path == tmp_path / "c"


def test_bad_values_are_usage_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("KTCLI_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.setenv("KTCLI_TOP_K", "many")
    with pytest.raises(UsageError, match="top_k"):
        load_settings()


def test_unknown_key_in_file(tmp_path, monkeypatch):
    cfg = tmp_path / "config.toml"
    cfg.write_text("colour = 'red'\n")
    monkeypatch.setenv("KTCLI_CONFIG", str(cfg))
    with pytest.raises(UsageError, match="colour"):
        load_settings()
