"""The parser's one-line errors, run as the user runs ktcli (no model is loaded)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def _ktcli(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "KTCLI_CONFIG": os.devnull, "KTCLI_CACHE_DIR": str(tmp_path)}
    # (from the checkout under test: elsewhere `-m ktcli` may import another one's, as a
    # clone's run with the main checkout's virtualenv did, and passed on its old code)
    return subprocess.run([sys.executable, "-m", "ktcli", *args], capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])


@pytest.mark.parametrize("args, said", [
    # click offered "(Possible options: --quiet)" for summarize's --outline given to ask
    (("ask", "notes.md", "q?", "--outline", "always"),
     "error: ktcli ask takes no --outline: it is an option of ktcli summarize and ktcli plan "
     "(see `ktcli ask --help`)"),
    (("summarize", "notes.md", "--top-k", "3"),
     "error: ktcli summarize takes no --top-k: it is an option of ktcli ask and ktcli plan "
     "(see `ktcli summarize --help`)"),
    (("summarize", "notes.md", "--embed", "all"),
     "error: ktcli summarize takes no --embed: it is an option of ktcli ask and ktcli plan "
     "(see `ktcli summarize --help`)"),
    (("serve", "--outline", "never"),
     "error: ktcli serve takes no --outline: it is an option of ktcli summarize and ktcli plan "
     "(see `ktcli serve --help`)"),
    (("ask", "notes.md", "q?", "--bogus"), "error: No such option: --bogus (see `ktcli ask --help`)"),
    # ktcli's own option after a command: "(Possible options: --attention, --json)" (probe 126)
    (("ask", "--version"), "error: ktcli ask takes no --version: it is ktcli's own, before the command "
                           "(`ktcli --version`)"),
])
def test_an_option_of_another_command_is_named_as_such(tmp_path, args, said):
    done = _ktcli(*args, tmp_path=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == said


@pytest.mark.parametrize("json_flag", [True, False])
@pytest.mark.parametrize("module", ["typer", "pydantic"])
def test_a_sigterm_while_ktcli_starts_is_said(tmp_path, json_flag, module):
    """SIGTERM in the first ~0.3 s (the imports, before `_main` puts its handler in) ended
    the process by the default action: no line on stderr, no --json object; it arrives
    here as typer is imported, the bulk of the start. One while typer parses the command
    line (its first parse imports pydantic, up to a second on a busy machine) was made a
    returned 130 by typer: exit 130, unsaid."""
    child = (
        "import importlib.abc, os, signal, sys, time\n"
        "class Kill(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name == {module!r}:\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "            time.sleep(0.5)\n"
        "            sys.exit('the SIGTERM went unanswered')\n"
        "sys.meta_path.insert(0, Kill())\n"
        f"sys.argv = ['ktcli', 'plan', 'notes.md', 'q?'{', ' + repr('--json') if json_flag else ''}]\n"
        "from ktcli.cli.app import main\n"
        "main()\n")
    env = {**os.environ, "KTCLI_CONFIG": os.devnull, "KTCLI_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 143, done.stderr
    assert done.stderr == "error: terminated (SIGTERM)\n"
    if json_flag:
        import json

        assert json.loads(done.stdout) == {"error": "terminated (SIGTERM)", "exit_code": 143}
    else:
        assert done.stdout == ""


@pytest.mark.parametrize("json_flag", [True, False])
def test_a_ctrl_c_while_ktcli_starts_is_said(tmp_path, json_flag):
    """Probe 124: Ctrl-C in the first ~0.3 s (the imports) printed the traceback of the
    import it landed in, exit -2 and no --json object. Here it arrives as typer is
    imported, in `python -m ktcli` as a user runs it (the finder put in by sitecustomize)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, os, signal, sys, time\n"
        "class Kill(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'typer':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "            time.sleep(0.5)\n"
        "            sys.exit('the Ctrl-C went unanswered')\n"
        "sys.meta_path.insert(0, Kill())\n")
    paths = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "KTCLI_CONFIG": os.devnull, "KTCLI_CACHE_DIR": str(tmp_path),
           "PYTHONPATH": os.pathsep.join(paths)}
    args = ["plan", "notes.md", "q?", *(["--json"] if json_flag else [])]
    done = subprocess.run([sys.executable, "-m", "ktcli", *args], capture_output=True, text=True, env=env, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert done.stderr == "error: interrupted\n"
    if json_flag:
        import json

        assert json.loads(done.stdout) == {"error": "interrupted", "exit_code": 130}
    else:
        assert done.stdout == ""


def test_a_program_importing_ktcli_keeps_its_own_ctrl_c():
    """The handler above is the command's: a test runner that imports ktcli.cli.app keeps
    Python's KeyboardInterrupt."""
    import ktcli.cli.app  # noqa: F401

    assert signal.getsignal(signal.SIGINT) is not ktcli.cli.app._ended_while_starting


@pytest.mark.parametrize("command", ["plan", "ask"])
def test_a_cache_dir_that_is_a_symlink_loop_is_one_line_before_the_input_is_read(tmp_path, command):
    """`plan` exited 0 and `ask` read its standard input first (here it never ends)."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    env = {**os.environ, "KTCLI_CONFIG": os.devnull, "KTCLI_CACHE_DIR": str(loop)}
    p = subprocess.Popen([sys.executable, "-m", "ktcli", command, "-", "q?"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        p.wait(timeout=60)  # (its stdin left open: read first, it would wait for ever)
        out, err = p.stdout.read(), p.stderr.read()
    finally:
        p.kill()
        p.wait()
        for stream in (p.stdin, p.stdout, p.stderr):
            stream.close()
    assert p.returncode == 2 and out == ""
    assert err == f"error: KTCLI_CACHE_DIR {loop}: cannot use it (Too many levels of symbolic links)\n"


def test_plan_json_help_names_every_key_it_prints(tmp_path):
    """Probe 108: `plan --help` listed the object's keys without `warnings`, which it prints
    (the README lists it)."""
    import json
    import re

    from ktcli.cli.app import PlanJson

    (tmp_path / "notes.md").write_text("The pump is in hall 4.\n")
    done = _ktcli("plan", str(tmp_path / "notes.md"), "Where is the pump?", "--json", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    helped = set(re.findall(r"\w+", PlanJson.__metadata__[0].help.split("(", 1)[1]))
    assert set(json.loads(done.stdout)) == helped


def test_a_run_planned_at_hours_is_said_before_it_starts():
    """Probe 108: a 36.6M-token input was planned at ~27,559 s to its first token and `ask`
    started without a word; the status line said "~27559s"."""
    from dataclasses import replace
    from types import SimpleNamespace

    from ktcli.cli.common import Options
    from ktcli.types import Mode, Plan

    class Said:
        def __init__(self):
            self.status_lines, self.warnings = [], []

        def status(self, line):
            self.status_lines.append(line)

        def warn(self, line):
            self.warnings.append(line)

    plan = Plan(mode=Mode.RETRIEVAL, task="ask", input_tokens=36_600_000, question_tokens=5, context_window=8192,
                answer_budget=384, evidence_budget=3072, n_documents=1, n_chunks=143_000, n_windows=1, top_k=8,
                est_seconds=30_000.0, est_memory_bytes=2**30, est_first_token_seconds=27_559.0)
    said = Said()
    Options({})._show_plan(said)(SimpleNamespace(plan=plan))
    assert said.status_lines[0].endswith("est first token ~7.7 h, ≤8.3 h")
    assert said.warnings == ["this run is planned to take ~8.3 h on this machine (`ktcli plan` says why); "
                             "Ctrl-C stops it"]
    said = Said()
    Options({})._show_plan(said)(SimpleNamespace(plan=replace(plan, est_seconds=3000.0)))
    assert said.warnings == []


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_after_the_command_finished_ends_it_with_its_own_status(tmp_path, sig):
    """Probe 121: a Ctrl-C just after `ask --json` printed its whole answer object landed in
    the interpreter's exit (torch's finalizers): "Exception ignored in atexit callback ...
    KeyboardInterrupt" on stderr, or death by the signal (exit 130 after an object whose
    exit is 0). Here the signal comes from an exit callback, after `plan --json` is done."""
    import json

    notes = tmp_path / "notes.md"
    notes.write_text("The tide turns at noon.\n")
    child = (
        "import atexit, os, signal, sys, time\n"
        f"atexit.register(lambda: (os.kill(os.getpid(), signal.{sig}), time.sleep(0.3)))\n"
        f"sys.argv = ['ktcli', 'plan', {str(notes)!r}, 'q?', '--json', '-q']\n"
        "from ktcli.cli.app import main\n"
        "main()\n")
    env = {**os.environ, "KTCLI_CONFIG": os.devnull, "KTCLI_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 0, done.stderr
    assert "KeyboardInterrupt" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout)["plan"]["task"] == "ask"
