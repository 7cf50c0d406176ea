"""A sparse policy's pages per step stay inside the model's window (`longctx._check_read_span`)."""

from __future__ import annotations

import pytest

from ktcli.engine.longctx import LongContextOptions, _check_read_span, make_policy
from ktcli.errors import UsageError


@pytest.mark.parametrize("spec", ["topk", "topk:107", "window", "window:119"])
def test_policies_within_the_window_load(spec):
    _check_read_span(make_policy(spec), LongContextOptions(), 8192, 512)


@pytest.mark.parametrize(("spec", "most"), [("topk:100000", "topk:107"), ("topk:108", "topk:107"),
                                            ("window:1000", "window:119")])
def test_policies_that_read_past_the_window_are_refused_with_the_most_they_may(spec, most):
    """topk:100000 read a 16K-token input whole, past SmolLM2's 8K window: "need"."""
    with pytest.raises(UsageError, match=f"past the model's 8,192-token window, where its answers are noise: at most {most}$"):
        _check_read_span(make_policy(spec), LongContextOptions(), 8192, 512)


def test_ask_and_serve_check_the_span_before_loading(smollm2_dir):
    from ktcli.engine.longctx import check_attention_span

    check_attention_span(smollm2_dir, "topk:16")
    with pytest.raises(UsageError, match="at most window:119"):
        check_attention_span(smollm2_dir, "window:1000")
    check_attention_span(smollm2_dir, "window:1000", "yarn:8")  # stretched to 64K: within it


def test_the_plan_refuses_what_the_load_would(tmp_path, smollm2_dir):
    """`ktcli plan --attention topk:500` printed a plan that `ask` then refused at its load."""
    import subprocess
    import sys

    from tests.serve.helpers import ROOT, cli_env

    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / smollm2_dir.name).symlink_to(smollm2_dir)  # converted: its config is read
    proc = subprocess.run([sys.executable, "-m", "ktcli.cli.app", "plan", "sample_docs/minirepo", "q", "--mode", "sparse",
                           "--attention", "topk:500"], capture_output=True, text=True, env=cli_env(cache), cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 2 and "at most topk:107" in proc.stderr and "Traceback" not in proc.stderr
