"""`ktcli plan` (`api.plan_only`): what it asks of whom, and what it says it assumed."""

from __future__ import annotations

import pytest

from ktcli.pipeline.events import NullReporter

from .test_qa_pipeline import settings_for


def test_a_plan_for_a_server_with_its_window_given_asks_the_server_nothing(tmp_path, monkeypatch):
    """`plan --backend openai --context-window 4096` failed "cannot reach the server" with the
    server down: it asked /v1/models for a window it had been given."""
    from ktcli.engine import openai_backend
    from ktcli.pipeline import api

    def never(*a, **kw):
        raise AssertionError("the server was contacted")

    monkeypatch.setattr(openai_backend, "_discover_cached", never)
    doc = tmp_path / "note.txt"
    doc.write_text("The pump station was rebuilt in 2021.\n")
    settings = settings_for(tmp_path, mode="auto", backend="openai", base_url="http://127.0.0.1:9/v1",
                            context_window=4096)
    prep, extra = api.plan_only([str(doc)], "What was rebuilt?", settings, NullReporter())
    assert prep.plan.context_window == 4096 and extra["model"]["contacted"] is False
    assert extra["model"]["name"] == "the server's first model"
    assert "not contacted" in extra["model"]["assumed"] and "--context-window 4096" in extra["model"]["assumed"]
    named = settings_for(tmp_path, mode="auto", backend="openai", base_url="http://127.0.0.1:9/v1",
                         context_window=4096, model="Qwen/Qwen2.5-7B-Instruct")
    assert api.plan_only([str(doc)], "What was rebuilt?", named, NullReporter())[1]["model"]["name"] == \
        "Qwen/Qwen2.5-7B-Instruct"
    # without the window it must ask (and an ask or a summary always does)
    with pytest.raises(AssertionError, match="contacted"):
        api.plan_only([str(doc)], "What was rebuilt?", settings_for(
            tmp_path, mode="auto", backend="openai", base_url="http://127.0.0.1:9/v1"), NullReporter())
