"""The OpenAI wire format: request validation and response bodies. No sockets here.

Every way a request can be wrong becomes an `ApiError` (a 4xx with an OpenAI-style JSON
error body), so nothing a client sends can reach the engine malformed.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from ktcli.engine.backend import SamplingParams

MAX_BODY_BYTES = 32 * 2**20
MAX_STOP_STRINGS = 16
# Choices one request may ask for (the completions API's prompts, each a choice): each is
# a request of its own to the engine, and one request may not queue work without bound.
MAX_CHOICES = 64
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class GenRequest:
    kind: str  # "chat" | "completion"
    prompts: list[list[int]]  # one a choice: a chat's one, a completion's list of prompts
    params: list[SamplingParams]  # each prompt's (its default max_tokens is what its window leaves)
    stream: bool
    include_usage: bool


def parse_json(raw: bytes) -> dict:
    if not raw.strip():
        raise ApiError(400, "the request body is empty: send a JSON object")
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as e:
        raise ApiError(400, f"the request body is not UTF-8 (byte {e.start}): send JSON in UTF-8") from None
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return data


def check_model(body: dict, served: str) -> None:
    model = body.get("model")
    if model is None:
        return  # one model is served: leaving it out is unambiguous
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string", param="model")
    if model != served:
        # OpenAI's 404 for a model: type invalid_request_error, code model_not_found
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {served!r}",
                       code="model_not_found", param="model")


def _number(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ApiError(400, f"'{name}' must be a number from {lo} to {hi}", param=name)
    return float(value)


def _integer(body: dict, name: str, lo: int, hi: int = 2**63 - 1) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():  # 3.0, as JSON writers in some languages send 3
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ApiError(400, f"'{name}' must be an integer from {lo} to {hi}", param=name)
    return value


def _valid_text(text: str, where: str, param: str) -> str:
    """Text the tokenizer can take: a lone surrogate ("\\ud800", valid JSON) failed it with a 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, f"{where} holds a lone UTF-16 surrogate (not a character)", param=param) from None
    return text


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, f"'stop' must be a string or a list of up to {MAX_STOP_STRINGS} strings", param="stop")
    return tuple(s for s in stop if s)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", param=name)
    return value


# Template variables a client may not set: the conversation and the tokens are ours.
_RESERVED_TEMPLATE_VARS = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools"})


def template_kwargs(body: dict) -> dict | None:
    """vLLM's `chat_template_kwargs`: variables for the model's chat template, such as
    Qwen3's {"enable_thinking": true} (ktcli renders with thinking off by default)."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ApiError(400, "'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    reserved = sorted(_RESERVED_TEMPLATE_VARS & set(value))
    if reserved:
        raise ApiError(400, f"'chat_template_kwargs' may not set {', '.join(reserved)}", param="chat_template_kwargs")
    return value


def _include_usage(body: dict) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", param="stream_options")
    flag = options.get("include_usage")
    if flag is None:  # absent or null: the default, as every other null here
        return False
    if not isinstance(flag, bool):  # "no" read as true
        raise ApiError(400, "'stream_options.include_usage' must be true or false", param="stream_options")
    return flag


def _text_content(content: object, index: int, role: str) -> str:
    """A message's text: a string, or the text parts of a content list (no images here);
    an assistant turn may have none (`null` beside the tool calls it made)."""
    if content is None and role == "assistant":
        return ""
    if isinstance(content, str):
        return _valid_text(content, f"messages[{index}].content", "messages")
    if isinstance(content, list):
        texts = []
        for part in content:
            # An assistant turn the API refused to answer holds a "refusal" part: its words
            # were the turn's text (the openai SDK sends it back in a conversation).
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "refusal" and role == "assistant" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
                continue
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported", param="messages")
            texts.append(part["text"])
        # Parts joined by a line break, as vLLM joins them ("Hello" and "world" read "Helloworld")
        return _valid_text("\n".join(texts), f"messages[{index}].content", "messages")
    raise ApiError(400, f"messages[{index}].content must be a string or a list of text parts", param="messages")


def parse_messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ApiError(400, f"messages[{i}] must be an object", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise ApiError(400, f"messages[{i}].role must be one of {', '.join(sorted(ROLES))}", param="messages")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _text_content(m.get("content"), i, role)})
    return out


def _check_length(chars: int, max_chars: int, window: int, param: str) -> None:
    """Refuse, before tokenising, text too long for the window by any tokenisation."""
    if chars > max_chars:
        raise ApiError(400, f"the prompt is {chars:,} characters, more than this model's context window of "
                       f"{window} tokens can hold", code="context_length_exceeded", param=param)


# Text of more characters than this many for each token of the window is counted a slice at
# a time before it is tokenised whole (`check_token_count`). A prompt that fits the window is
# shorter, but for runs of spaces and the like, which the whole count still sees.
_SLICED_COUNT_FROM = 8
_SLICE_CHARS = 8192
_SLICE_SLACK = 4  # tokens a cut between two slices may add (a token split, merges undone)


def check_token_count(texts: list[str], encode: Callable[[str], list[int]], window: int, param: str,
                      subject: str = "") -> None:
    """Refuse text over the window by its tokens, counted a slice at a time and stopped as
    soon as they pass it. The character bound lets through 660K characters of CJK text
    (~2.7 tokens a character): tokenised whole, 1.8M tokens before the 400, three such
    requests froze every other client's stream for 4-5 s."""
    if sum(map(len, texts)) <= window * _SLICED_COUNT_FROM:
        return
    counted = slices = 0
    for text in texts:
        for at in range(0, len(text), _SLICE_CHARS):
            counted += len(encode(text[at : at + _SLICE_CHARS]))
            slices += 1
            if counted > window + _SLICE_SLACK * slices:
                # "the messages holds" read wrong; a list of prompts names the one too long
                subject = subject or ("the messages hold" if param == "messages" else f"the {param} holds")
                raise ApiError(400, f"{subject} more than this model's context window of {window} tokens",
                               code="context_length_exceeded", param=param)


def check_prompt_length(prompt: str, max_chars: int, window: int) -> None:
    _check_length(len(prompt), max_chars, window, "prompt")


def check_messages_length(messages: list[dict], max_chars: int, window: int, message_tokens: int = 1) -> None:
    """`_check_length` for a chat, before its template is rendered: each message also costs
    tokens of its own (`message_tokens`: its role's header and end), so 200,000 empty
    messages, which took seconds of rendering before their 400, are refused by their
    count, and so are 8,000 (5 s each, which slowed every other client 7x)."""
    if len(messages) * max(1, message_tokens) > window:
        raise ApiError(400, f"{len(messages):,} messages are more than this model's context window of {window} "
                       "tokens can hold", code="context_length_exceeded", param="messages")
    _check_length(sum(len(m["content"]) for m in messages), max_chars, window, "messages")


def parse_prompts(body: dict, encode: Callable[[str], list[int]], vocab_size: int, max_chars: int,
                  window: int, bos_id: int | None = None) -> list[list[int]]:
    """The completions API's `prompt`: a text or a list of token ids, or a list of several
    of either, each answered with a choice of its own."""
    prompt = body.get("prompt")
    if prompt == []:  # no prompt, or a prompt of no tokens: neither is sure to be meant
        raise ApiError(400, "'prompt' is an empty list: send a string, a list of token ids, or a list of either",
                       param="prompt")
    if not (isinstance(prompt, list) and all(isinstance(p, (str, list)) for p in prompt)):
        return [_prompt_ids(prompt, None, encode, vocab_size, max_chars, window, bos_id)]
    if len(prompt) > MAX_CHOICES:
        raise ApiError(400, f"'prompt' holds {len(prompt)} prompts; at most {MAX_CHOICES} are answered in one request",
                       param="prompt")
    return [_prompt_ids(p, i if len(prompt) > 1 else None, encode, vocab_size, max_chars, window, bos_id)
            for i, p in enumerate(prompt)]


def _prompt_ids(prompt: object, index: int | None, encode: Callable[[str], list[int]], vocab_size: int,
                max_chars: int, window: int, bos_id: int | None) -> list[int]:
    """One prompt's token ids; `index`: its place in a list of several."""
    where = "'prompt'" if index is None else f"'prompt'[{index}]"
    if isinstance(prompt, str):
        _check_length(len(prompt), max_chars, window, "prompt")
        prompt = _valid_text(prompt, where, "prompt")
        check_token_count([prompt], encode, window, "prompt", "the prompt holds" if index is None else f"{where} holds")
        return encode(prompt) or _start_of_text(bos_id)
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt):
        bad = next((t for t in prompt if t >= vocab_size), None)
        if bad is not None:  # it would fail the whole batch it joined in the engine
            raise ApiError(400, f"{where} token id {bad} is outside this model's vocabulary (0-{vocab_size - 1})",
                           param="prompt")
        return list(prompt) or _start_of_text(bos_id)
    either = "" if index is not None else ", or a list of either"
    raise ApiError(400, f"{where} must be a string or a list of token ids{either}", param="prompt")


def _start_of_text(bos_id: int | None) -> list[int]:
    """What a prompt of no tokens ("") runs on: the model's beginning-of-sequence token
    alone, from which OpenAI's completions write a text from its start. An engine cannot
    run no tokens, and a model with no such token has nothing else to start from."""
    if bos_id is None:
        raise ApiError(400, "the prompt has no tokens, and this model has no beginning-of-sequence token to "
                       "start from: send some text", param="prompt")
    return [bos_id]


# Fields that change what a response holds, which this server does not produce: refused,
# so a client never reads their absence as an answer ("logprobs": true with none back).
# name -> (the values that ask for nothing, why refused)
UNSUPPORTED = {
    "logprobs": ((None, False, 0), "log probabilities are not returned"),  # 0: the completions API's "none"
    "top_logprobs": ((None, 0), "log probabilities are not returned"),
    "echo": ((None, False), "the prompt is not echoed"),
    "best_of": ((None, 1), "only best_of=1 is supported"),
    "suffix": ((None, ""), "suffixes (insertion) are not supported"),
    "tools": ((None, []), "tool calls are not supported"),
    "functions": ((None, []), "function calls are not supported"),
    "response_format": ((None, {"type": "text"}), "only text responses are produced (no JSON mode or schema)"),
    "frequency_penalty": ((None, 0, 0.0), "penalties are not applied"),
    "presence_penalty": ((None, 0, 0.0), "penalties are not applied"),
    "repetition_penalty": ((None, 1, 1.0), "penalties are not applied"),
    "logit_bias": ((None, {}), "logit biases are not applied"),
    # vLLM's and others' sampling extensions: each changes the answer, so it is refused,
    # not ignored (guided_json above all: the client expects JSON back).
    "min_p": ((None, 0, 0.0), "min-p sampling is not applied"),
    "min_tokens": ((None, 0), "a minimum length is not applied"),
    "ignore_eos": ((None, False), "the end of sequence is always honoured"),
    "stop_token_ids": ((None, []), "stop token ids are not applied (use 'stop' strings)"),
    "bad_words": ((None, []), "bad words are not applied"),
    "guided_json": ((None,), "guided decoding is not supported"),
    "guided_regex": ((None,), "guided decoding is not supported"),
    "guided_choice": ((None,), "guided decoding is not supported"),
    "guided_grammar": ((None,), "guided decoding is not supported"),
    "structured_outputs": ((None,), "guided decoding is not supported"),
    "continue_final_message": ((None, False), "continuing the last assistant message is not supported"),
    "include_stop_str_in_output": ((None, False), "the stop string is never included in the output"),
    "use_beam_search": ((None, False), "beam search is not supported"),
    "length_penalty": ((None, 1, 1.0), "length penalties (of beam search) are not applied"),
    "prompt_logprobs": ((None,), "log probabilities are not returned"),
    "truncate_prompt_tokens": ((None,), "prompts are never truncated"),
    "tool_choice": ((None, "none", "auto"), "tool calls are not supported"),
    "modalities": ((None, ["text"]), "only text is produced"),
    "audio": ((None,), "only text is produced"),
    "prediction": ((None,), "predicted outputs are not supported"),
    # llama.cpp's, text-generation-webui's and KoboldCpp's sampler names, which clients of
    # local servers send: each returned 200 with the answer it would give without them.
    # Their settings (repeat_last_n, mirostat_tau, dynatemp_exponent...) ask for nothing
    # while these are off, and such clients send them with every request: taken.
    "repeat_penalty": ((None, 1, 1.0), "penalties are not applied"),
    "typical_p": ((None, 1, 1.0), "typical sampling is not applied"),
    "tfs_z": ((None, 1, 1.0), "tail-free sampling is not applied"),
    "top_a": ((None, 0, 0.0), "top-a sampling is not applied"),
    "mirostat": ((None, 0), "mirostat sampling is not applied"),
    "dynatemp_range": ((None, 0, 0.0), "dynamic temperature is not applied"),
    "xtc_probability": ((None, 0, 0.0), "XTC sampling is not applied"),
    "dry_multiplier": ((None, 0, 0.0), "DRY penalties are not applied"),
    "grammar": ((None, ""), "guided decoding is not supported"),
    "json_schema": ((None,), "guided decoding is not supported"),
    "add_generation_prompt": ((None, True), "the assistant's turn is always opened"),
}


def sampling(body: dict, prompt_len: int, window: int, default_max: int, param: str = "messages",
             which: str = "the prompt") -> SamplingParams:
    """The request's sampling for one prompt (`which`, named in the window's errors)."""
    n = body.get("n")
    # (1.0 too, as max_tokens takes an integral float: probe 100 saw it refused; true is no 1)
    if n is not None and (isinstance(n, bool) or not isinstance(n, (int, float)) or n != 1):
        raise ApiError(400, "only n=1 is supported", param="n")
    for name, (off, why) in UNSUPPORTED.items():
        value = body.get(name)
        if not any(value is o or (type(value) is type(o) and value == o) for o in off):
            raise ApiError(400, f"'{name}': {why} by this server", param=name)
    if prompt_len >= window:
        raise ApiError(400, f"{which} has {prompt_len} tokens; this model's context window is {window}",
                       code="context_length_exceeded", param=param)
    asked, asked_by = _integer(body, "max_completion_tokens", 1), "max_completion_tokens"
    if asked is None:
        asked, asked_by = _integer(body, "max_tokens", 1), "max_tokens"
    if asked is not None and prompt_len + asked > window:
        raise ApiError(400, f"{which} has {prompt_len} tokens and {asked} more were asked for; "
                       f"this model's context window is {window}", code="context_length_exceeded", param=asked_by)
    top_k = _integer(body, "top_k", -1)
    return SamplingParams(
        max_new_tokens=asked if asked is not None else min(default_max, window - prompt_len),
        temperature=_number(body, "temperature", 0.0, 2.0, 1.0),  # OpenAI's default
        # OpenAI takes 0: the most likely token only, which a tiny top-p keeps (0 itself kept none)
        top_p=max(_number(body, "top_p", 0.0, 1.0, 1.0), 1e-6),
        top_k=max(0, top_k or 0),
        stop=_stop(body),
        seed=_integer(body, "seed", -(2**63)),  # any 64-bit integer, as OpenAI and vLLM take
        keep_prompt=True,  # the engine keeps only long prompts (engine.prefix_store.MIN_TOKENS)
    )


def parse_generation(kind: str, body: dict, *, served: str, window: int, vocab_size: int, max_chars: int,
                     default_max: int, encode_chat: Callable[..., list[int]],
                     encode_text: Callable[[str], list[int]], message_tokens: int = 1,
                     bos_id: int | None = None) -> GenRequest:
    check_model(body, served)
    stream = _flag(body, "stream")
    include_usage = _include_usage(body)
    if body.get("stream_options") is not None and not stream:
        raise ApiError(400, "'stream_options' is only allowed with 'stream': true", param="stream_options")
    if kind == "chat":
        messages = parse_messages(body)
        check_messages_length(messages, max_chars, window, message_tokens)
        check_token_count([m["content"] for m in messages], encode_text, window, "messages")
        prompts = [encode_chat(messages, template_kwargs(body))]
    else:
        prompts = parse_prompts(body, encode_text, vocab_size, max_chars, window, bos_id)
    param = "messages" if kind == "chat" else "prompt"
    names = [f"'prompt'[{i}]" for i in range(len(prompts))] if len(prompts) > 1 else ["the prompt"]
    params = [sampling(body, len(ids), window, default_max, param, name) for ids, name in zip(prompts, names)]
    return GenRequest(kind, prompts, params, stream, include_usage)


# -- responses -----------------------------------------------------------------------


class Reply:
    """The bodies of one answer, complete or in chunks, sharing an id and timestamp."""

    def __init__(self, kind: str, model: str, include_usage: bool = False) -> None:
        self.kind, self.model = kind, model
        self.include_usage = include_usage  # chunks then carry "usage": null until the last (OpenAI's shape)
        self.id = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict:
        obj = "chat.completion" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj + (".chunk" if chunk and self.kind == "chat" else ""),
                "created": self.created, "model": self.model}

    def full(self, answers: list[tuple[str, str]], usage: dict) -> dict:
        """The whole answer: each choice's (text, finish reason), in index order."""
        choices = []
        for index, (text, finish) in enumerate(answers):
            if self.kind == "chat":
                # "logprobs": null as OpenAI sends it: strictly typed clients require the key
                choices.append({"index": index, "message": {"role": "assistant", "content": text}, "logprobs": None,
                                "finish_reason": finish})
            else:
                choices.append({"index": index, "text": text, "logprobs": None, "finish_reason": finish})
        return {**self._head(False), "choices": choices, "usage": usage}

    def chunk(self, text: str, finish: str | None = None, first: bool = False, index: int = 0) -> dict:
        if self.kind == "chat":
            delta: dict = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
        body = {**self._head(True), "choices": [choice]}
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._head(True), "choices": [], "usage": usage}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage, with the prompt tokens read back from the prompt cache as its
    `prompt_tokens_details.cached_tokens` (vLLM's too): a client's second question about a
    7K-token document answered in 1 s, and nothing said why."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
