"""Access tokens inside ordinary files, masked in what goes to a remote model server."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ktcli.ingest.credentials import mask

# Made-up tokens of each format's shape (none is a real credential).
TOKENS = {
    "a GitHub token": "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
    "an AWS access key": "AKIA" + "IOSFODNN7EXAMPLE",
    "a Slack token": "xoxb-" + "1234567890-0987654321-AbCdEfGhIjKl",
    "an OpenAI or Anthropic API key": "sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0UvWx",
    "a Google API key": "AIza" + "SyA1234567890abcdefghijklmnopqrstuv",
    "a Hugging Face token": "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567",
}


@pytest.mark.parametrize("kind", sorted(TOKENS))
def test_a_token_is_masked_to_its_prefix_keeping_the_texts_shape(kind):
    token = TOKENS[kind]
    text = f"deploy:\n  user: ci\n  token: {token}  # rotate yearly\nend\n"
    masked, found = mask(text)
    assert found == [(kind, 3)]
    assert len(masked) == len(text) and masked.count("\n") == text.count("\n")
    assert token not in masked and "*" * 10 in masked and "rotate yearly" in masked


@pytest.mark.parametrize("text", [
    "commit 3f9a2b7c1d4e5f60718293a4b5c6d7e8f9012345 fixed it",  # a hash
    "id 123e4567-e89b-12d3-a456-426614174000",  # a UUID
    "The sk-learn docs and the hf_hub_download helper; ghp_ prefixes mark GitHub tokens.",
    "AKIA is the prefix of an AWS key id",
    "variable task-0123456789abcdef0123456789abcdef0 ends here",
])
def test_text_that_only_looks_like_a_token_is_left_alone(text):
    assert mask(text) == (text, [])


def test_a_remote_servers_input_is_masked_and_said_a_local_models_is_not(tmp_path):
    from ktcli.config import Settings
    from ktcli.pipeline.prepare import prepare
    from tests.pipeline.test_qa_pipeline import Warnings
    from tests.serve.fake_openai import FakeOpenAI

    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "config.yml").write_text(f"deploy:\n  token: {TOKENS['a GitHub token']}\n")
    (tmp_path / "repo" / "notes.md").write_text("The deploy runs nightly.\n")
    reporter = Warnings()
    with FakeOpenAI() as fake:
        remote = replace(Settings(), cache_dir=str(tmp_path / "c"), backend="openai", base_url=fake.url,
                         model="fake-model")
        prep = prepare([str(tmp_path / "repo")], "what token?", "ask", remote, reporter)
    text = "".join(d.text for d in prep.corpus.documents) + "".join(c.text for c in prep.chunks)
    assert TOKENS["a GitHub token"] not in text and "ghp_****" in text
    assert any("masked what look like access tokens before sending the input to" in w and "config.yml:2 (a GitHub "
               "token)" in w for w in reporter.lines)
    local = prepare([str(tmp_path / "repo")], "what token?", "ask", replace(remote, backend="local", model="smollm2"),
                    Warnings())
    assert TOKENS["a GitHub token"] in "".join(d.text for d in local.corpus.documents)
