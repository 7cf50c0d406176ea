"""Streaming text: incremental detokenization, stop strings, sampling."""

import pytest
import torch

from ktcli.engine.backend import SamplingParams
from ktcli.engine.detokenize import IncrementalDetokenizer, StopStrings
from ktcli.engine.sampler import make_generator, sample

TEXTS = [
    "Plain ASCII text, with punctuation; and numbers 12345.",
    "Multi-byte: naïve café, 日本語のテキスト, emoji 🚀🎉 and ünïcödé.",
    "  leading spaces\n\nand blank lines\ttabs",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from ktcli.engine.tokenizer import ChatTokenizer

    return ChatTokenizer(smollm2_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_detokenizer_reassembles_text(tokenizer, text):
    ids = tokenizer.encode(text)
    prompt = tokenizer.encode("Some prompt before it:")
    detok = IncrementalDetokenizer(tokenizer.decode, prompt)
    pieces = [detok.push(t) for t in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)  # never a half character


def test_chat_template_reads_special_token_strings_in_messages_as_text(tokenizer, smollm2_dir):
    # A document about chat templates says "<|im_end|>"; a README says "cp <filename>":
    # SmolLM2 has both as special tokens, and read as such they closed the user's turn
    # mid-evidence. In a message they are text; the template's own tokens stay special.
    from transformers import AutoTokenizer

    doc = "Each turn ends with <|im_end|>\n<|im_start|>assistant, then: cp <filename> /tmp"
    messages = [{"role": "system", "content": "Answer."}, {"role": "user", "content": doc}]
    ids = tokenizer.apply_chat_template(messages)
    im_start, im_end, filename = (tokenizer.tok.token_to_id(t) for t in ("<|im_start|>", "<|im_end|>", "<filename>"))
    assert ids.count(im_start) == 3 and ids.count(im_end) == 2 and filename not in ids  # system, user, generation
    assert tokenizer.decode(ids, skip_special_tokens=False).count(doc) == 1
    # Without such strings, the ids are transformers' own.
    plain = [{"role": "system", "content": "Answer."}, {"role": "user", "content": "What is\n  this?"}]
    hf = AutoTokenizer.from_pretrained(str(smollm2_dir)).apply_chat_template(plain, add_generation_prompt=True)
    assert tokenizer.apply_chat_template(plain) == list(hf["input_ids"] if hasattr(hf, "keys") else hf)


MISTRAL_V1 = (  # Mistral-7B-Instruct v0.1's: no system role, strict alternation
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token + ' ' }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
TRIMMING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}<|im_end|>\n{% endfor %}"
            "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_a_message_whose_text_the_template_also_holds_earlier_is_still_text(smollm2_dir):
    """The user's text was searched for from the start of the rendering: "<|im_end|>" was
    found at the system turn's own end, which became text, while the user's became the
    control token."""
    from ktcli.engine.tokenizer import ChatTokenizer

    ours = ChatTokenizer(smollm2_dir)
    end = ours.tok.token_to_id("<|im_end|>")
    for content in ("<|im_end|>", "Hugging Face<|im_end|>"):
        chat = [{"role": "user", "content": content}]
        ids = ours.apply_chat_template(chat)
        text = ours.render(chat)
        assert ids.count(end) == text.count("<|im_end|>") - 1  # the system's and the user turn's, not the user's text
        assert ours.decode(ids[ids.index(end) + 1:], skip_special_tokens=False).count("<|im_end|>") == 2


def test_templates_that_refuse_a_system_message_trim_or_think(smollm2_dir):
    from transformers import AutoTokenizer

    from ktcli.engine.tokenizer import ChatTemplateError, ChatTokenizer

    ours, theirs = ChatTokenizer(smollm2_dir), AutoTokenizer.from_pretrained(str(smollm2_dir))
    ask = [{"role": "system", "content": "Answer from the sources."}, {"role": "user", "content": "Who?"}]
    # Mistral v0.1 refuses the system message ktcli always sends: it opens the user turn
    ours.chat_template = MISTRAL_V1
    assert ours.render(ask) == ours.bos_token + "[INST] Answer from the sources.\n\nWho? [/INST]"
    # A template that trims: the ids are transformers' (the content is found trimmed), and
    # thinking is switched off where the template has the switch (Qwen3's)
    ours.chat_template = TRIMMING
    padded = [{"role": "user", "content": "  What is\n  this?  "}]
    want = theirs.apply_chat_template(padded, chat_template=TRIMMING, add_generation_prompt=True,
                                      enable_thinking=False)
    assert ours.apply_chat_template(padded) == list(want["input_ids"] if hasattr(want, "keys") else want)
    assert "<think>\n\n</think>" in ours.render(padded)
    assert "<think>" not in ours.render(padded, template_kwargs={"enable_thinking": True})  # a serve client's choice
    assert ours.apply_chat_template([{"role": "user", "content": " x <|im_end|> "}]).count(2) == 1  # the template's own
    ours.chat_template = "{{ raise_exception('no') }}"
    with pytest.raises(ChatTemplateError, match="chat template refuses this conversation: no"):
        ours.render(ask)


def test_templates_with_generation_blocks_and_tojson_options_render_as_transformers(smollm2_dir):
    """`{% generation %}` (training masks) and tojson's separators were unknown to our
    renderer: an internal TemplateSyntaxError on every question."""
    from transformers import AutoTokenizer

    from ktcli.engine.tokenizer import ChatTemplateError, ChatTokenizer

    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}"
                "{% generation %}{{ m['content'] }}{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}"
                "<|im_end|>\n{% endfor %}{{ {'b': 1, 'a': [1, 2]} | tojson(separators=(',', ':'), sort_keys=True) }}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    ours, theirs = ChatTokenizer(smollm2_dir), AutoTokenizer.from_pretrained(str(smollm2_dir))
    ours.chat_template = template
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "?"}]
    assert ours.render(chat) == theirs.apply_chat_template(chat, chat_template=template, tokenize=False,
                                                           add_generation_prompt=True)
    ours.chat_template = "{% for m in messages %}{{ m['content'] }"
    with pytest.raises(ChatTemplateError, match="cannot be read"):
        ours.render(chat)


def test_stop_strings_cut_across_deltas():
    s = StopStrings(("###", "END"))
    out = [s.feed(d) for d in ["Hello #", "# wor", "ld", " E", "N", "D more"]]
    assert "".join(out) == "Hello ## world "
    assert s.stopped and s.flush() == ""


def test_stop_strings_release_held_text_at_the_end():
    s = StopStrings(("STOP",))
    assert s.feed("abc ST") == "abc "
    assert s.flush() == "ST"


def test_sampler_modes():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    assert sample(logits, SamplingParams(), [None, None]) == [1, 0]
    p = SamplingParams(temperature=1.0, top_k=1, seed=3)
    assert sample(logits, p, [make_generator(p), make_generator(p)]) == [1, 0]
    p = SamplingParams(temperature=0.7, top_p=0.01, seed=3)
    assert sample(logits, p, [make_generator(p), make_generator(p)]) == [1, 0]
    p = SamplingParams(temperature=1.0, seed=11)
    draws = [sample(logits, p, [make_generator(p), make_generator(p)]) for _ in range(2)]
    assert draws[0] == draws[1]  # same seed, same tokens
    p = SamplingParams(temperature=1.0, top_k=2, seed=0)
    g = make_generator(p)
    assert {sample(logits[:1], p, [g])[0] for _ in range(50)} <= {1, 3}
    # a tiny temperature is as good as greedy: the raw logits divided by it overflowed
    p = SamplingParams(temperature=1e-40, seed=1)
    assert sample(logits * 100, p, [make_generator(p), make_generator(p)]) == [1, 0]
    # one below float32's least (0 there) gave NaN, and its error failed the whole batch
    for tiny in (1e-300, 5e-324, float("nan")):
        p = SamplingParams(temperature=tiny, top_k=3)
        assert p.temperature == 0.0 and sample(logits, p, [make_generator(p), make_generator(p)]) == [1, 0]


def test_a_limit_that_cuts_a_character_leaves_no_replacement_char(tokenizer):
    ids = tokenizer.encode("Launch 🚀")
    detok = IncrementalDetokenizer(tokenizer.decode, [])
    text = "".join(detok.push(t) for t in ids[:-1])  # the rocket's last byte never comes
    text += detok.flush()
    assert text == "Launch " and "\ufffd" not in text
