"""The `transformers` backend: a fallback for architectures our engine does not cover,
and the oracle our engine is tested against."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from ktcli.engine.backend import GenStats, Message, SamplingParams
from ktcli.engine.detokenize import StopStrings
from ktcli.engine.gguf_weights import write_safetensors
from ktcli.engine.tokenizer import ChatTemplateError, load_chat_tokenizer, no_chat_template, no_tokenizer
from ktcli.errors import BackendError, UsageError


class HFBackend:
    name = "hf"

    def __init__(self, model_dir: Path, *, threads: int = 0, dtype: str = "fp32") -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads > 0:
            torch.set_num_threads(threads)
        torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(dtype)
        if torch_dtype is None:
            raise UsageError(f"--weights {dtype}: the transformers engine (--engine hf) runs fp32 or bf16")
        # Prompts as our engine builds them (`ChatTokenizer`: a document's "<|im_end|>" stays
        # text, where transformers' template would read it as the control token). Read
        # first: a damaged tokenizer.json is said in one line naming it, not as
        # transformers' error.
        self.model_dir = Path(model_dir)
        self.chat = load_chat_tokenizer(self.model_dir) if (self.model_dir / "tokenizer.json").is_file() else None
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        except (ValueError, OSError):
            # transformers' several-line "couldn't instantiate the backend tokenizer"
            if (self.model_dir / "tokenizer.json").is_file():
                raise
            raise UsageError(no_tokenizer(model_dir, engine_hf=True)) from None
        write_safetensors(self.model_dir)  # a converted GGUF: the weights file transformers reads, once
        _check_written_weights(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype)
        self.model.eval()
        import transformers

        from ktcli.engine.model_store import model_key

        # What makes its outputs for a prompt (`pipeline.notes_memo`): the folder's files, dtype, version
        self.outputs_key = f"hf-{model_key(self.model_dir, 'hf')}-{dtype}-{transformers.__version__}"
        self.context_window = _window(self.model.config)
        self._stats = GenStats()
        # The tokens that end an answer: generate() stops after one and hands it on, and one
        # that is no special token (a generation_config.json's eos list) was printed.
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        ends = {int(i) for i in ([eos] if isinstance(eos, int) else eos or [])}
        if self.tokenizer.eos_token_id is not None:
            ends.add(int(self.tokenizer.eos_token_id))
        self._ends = torch.tensor(sorted(ends), dtype=torch.long)

    def finish(self) -> str | None:
        return None  # nothing held back

    @property
    def last_stats(self) -> GenStats:
        return self._stats

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chat_ids(self, messages: list[Message], template_kwargs: dict | None = None) -> list[int]:
        if self.chat is not None and self.chat.chat_template:
            return self.chat.apply_chat_template(messages, add_generation_prompt=True, template_kwargs=template_kwargs)
        if not getattr(self.tokenizer, "chat_template", None):  # transformers' is a multi-line ValueError
            raise ChatTemplateError(no_chat_template(self.tokenizer.name_or_path))
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                 **(template_kwargs or {}))
        # transformers 5 returns a BatchEncoding here, 4.x a list
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def prompt_tokens(self, messages: list[Message]) -> int:
        return len(self.chat_ids(messages))

    def _generate_kwargs(self, params: SamplingParams) -> dict:
        kwargs: dict = {
            "max_new_tokens": params.max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
        }
        if params.temperature > 0:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p)
            if params.top_k:
                kwargs["top_k"] = params.top_k
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        return kwargs

    def stream_chat(self, messages: list[Message], params: SamplingParams) -> Iterator[str]:
        from transformers import StoppingCriteria, StoppingCriteriaList

        ids = self.chat_ids(messages)
        if len(ids) + params.max_new_tokens > self.context_window:
            raise BackendError(
                f"prompt of {len(ids)} tokens + {params.max_new_tokens} new exceeds the {self.context_window}-token window"
            )
        input_ids = torch.tensor([ids])
        streamer = _AnswerStreamer(self.tokenizer, self._ends, skip_prompt=True, skip_special_tokens=True)
        errors: list[BaseException] = []
        out_len = [0]
        cancel = threading.Event()  # set when the caller stops reading (closes this generator)

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs) -> bool:
                return cancel.is_set()

        def work() -> None:
            try:
                with torch.inference_mode():
                    out = self.model.generate(
                        input_ids, attention_mask=torch.ones_like(input_ids), streamer=streamer,
                        stopping_criteria=StoppingCriteriaList([Cancelled()]), **self._generate_kwargs(params),
                    )
                answer = out[0, input_ids.shape[1]:]
                out_len[0] = int((~torch.isin(answer, self._ends)).sum())  # as our engine counts: not the end token
            except BaseException as e:  # surfaced in the caller's thread below
                errors.append(e)
                streamer.end()

        start = time.perf_counter()
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        ttft = 0.0
        # transformers stops *after* the token that completes a stop string, and the
        # streamer has already passed its text on ("... 4, 5" for stop "5"): cut it here, as
        # the native engine does.
        stops = StopStrings(params.stop)
        held = ""  # a character still being written ("\ufffd": its first bytes' token came alone)
        try:
            for piece in streamer:
                if not ttft and piece:
                    ttft = time.perf_counter() - start
                piece = held + piece
                kept = piece.rstrip("\ufffd")
                piece, held = kept, piece[len(kept):]
                piece = stops.feed(piece)
                if piece:
                    yield piece
                if stops.stopped:
                    break
            # what is still held at the end is half a character (the answer cut at
            # --max-new-tokens): left out, as our engine leaves it out
            tail = stops.flush()
            if tail:
                yield tail
        finally:
            cancel.set()
            thread.join()
            total = time.perf_counter() - start
            ttft = ttft or total
            self._stats = GenStats(
                prompt_tokens=len(ids), new_tokens=out_len[0], prefill_s=ttft,
                decode_s=max(total - ttft, 1e-9), ttft_s=ttft, extra={"engine": "hf"},  # (--json: which ran)
            )
        if errors:
            raise BackendError(f"generation failed: {errors[0]}")

    def generate_chat_batch(self, batch: list[list[Message]], params: SamplingParams) -> list[str]:
        # Left padding keeps every prompt's last token at the end, where generation starts.
        self.tokenizer.padding_side = "left"
        prompts = [self.chat_ids(m) for m in batch]
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id or self.tokenizer.eos_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(input_ids, attention_mask=mask, **self._generate_kwargs(params))
        total = time.perf_counter() - start
        new = out[:, width:]
        texts = [self.tokenizer.decode(row[~torch.isin(row, self._ends)], skip_special_tokens=True).rstrip("\ufffd")
                 for row in new]
        n_new = int((new != pad).sum())
        self._stats = GenStats(
            prompt_tokens=sum(len(p) for p in prompts), new_tokens=n_new, prefill_s=0.0, decode_s=total,
            extra={"engine": "hf"},
        )
        return [_cut_at_stop(t, params.stop) for t in texts]


@functools.cache
def _answer_streamer_class():
    from transformers import TextIteratorStreamer

    class AnswerStreamer(TextIteratorStreamer):
        """transformers' streamer less the token that ended the answer."""

        def __init__(self, tokenizer, ends: torch.Tensor, **kwargs) -> None:
            super().__init__(tokenizer, **kwargs)
            self.ends = ends

        def put(self, value) -> None:
            if self.skip_prompt and self.next_tokens_are_prompt:
                super().put(value)
                return
            flat = value.reshape(-1)
            kept = flat[~torch.isin(flat, self.ends)]
            if kept.numel():
                super().put(kept)

    return AnswerStreamer


def _AnswerStreamer(tokenizer, ends: torch.Tensor, **kwargs):  # noqa: N802 - a class, made on first use
    return _answer_streamer_class()(tokenizer, ends, **kwargs)


def _cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if i >= 0:
            cut = min(cut, i)
    return text[:cut]


def _window(config) -> int:
    """The context the model runs, as our engine and the planner size it
    (`config.scaled_window`): a config with YaRN x4 over 1,024 positions was planned at 4,096
    tokens and run at 1,024 (its prompt then "exceeds the window", and retrieval found it
    too small), though transformers' rotary embedding computes every position."""
    from ktcli.engine.config import rope_params, scaled_window, text_settings

    cfg = text_settings(config.to_dict())
    return scaled_window(int(cfg.get("max_position_embeddings") or 2048), rope_params(cfg))


def _check_written_weights(folder: Path) -> None:
    """The CRC32s ktcli wrote into a safetensors file (a converted GGUF's weights: `gguf_convert`)
    checked before transformers' loader reads it, which checks none: bytes changed in place
    loaded as weights, silently. Files that record none (a model's own) are not read."""
    from ktcli.engine.safetensors_header import DamagedWeightsError, verify_checksums

    for path in sorted(folder.glob("*.safetensors")):
        if not verify_checksums(path):
            raise DamagedWeightsError(f"{path}: a tensor changed since it was written (a damaged file)")
