"""The parser's one-line errors, run as the user runs ktcli (no model is loaded)."""

import os
import subprocess
import sys

import pytest


def _ktcli(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KTCLI_CONFIG": os.devnull, "KTCLI_CACHE_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "ktcli", *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("args, said", [
    # click offered "(Possible options: --quiet)" for summarize's --outline given to ask
    (("ask", "notes.md", "q?", "--outline", "always"),
     "error: ktcli ask takes no --outline: it is an option of ktcli summarize and ktcli plan "
     "(see `ktcli ask --help`)"),
    (("summarize", "notes.md", "--top-k", "3"),
     "error: ktcli summarize takes no --top-k: it is an option of ktcli ask and ktcli plan "
     "(see `ktcli summarize --help`)"),
    (("serve", "--outline", "never"),
     "error: ktcli serve takes no --outline: it is an option of ktcli summarize and ktcli plan "
     "(see `ktcli serve --help`)"),
    (("ask", "notes.md", "q?", "--bogus"), "error: No such option: --bogus (see `ktcli ask --help`)"),
])
def test_an_option_of_another_command_is_named_as_such(tmp_path, args, said):
    done = _ktcli(*args, tmp_path=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == said
