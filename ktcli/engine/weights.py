"""Load a safetensors folder (or a converted GGUF's, `gguf_weights`) into the engine's
layout: q/k/v fused into one matrix and gate/up into another (fewer, bigger matmuls), q/k
rows permuted for interleaved RoPE, cast to the weight dtype one tensor at a time so peak
memory stays near the final size.
int8 (CPU only) packs each matrix, the embedding included, as `engine.int8_gemv` reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from ktcli.engine import int8_gemv
from ktcli.engine.config import ModelConfig
from ktcli.engine.rope import interleave_permutation
from ktcli.engine.safetensors_header import DamagedWeightsError, checksums_of, crc32, read_header
from ktcli.errors import UsageError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.uint8}


@dataclass
class LayerWeights:
    in_norm: torch.Tensor  # [hidden] fp32
    qkv: torch.Tensor  # [q_size + 2 kv_size, hidden]
    qkv_bias: torch.Tensor | None  # fp32
    o: torch.Tensor  # [hidden, q_size]
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 * intermediate, hidden]: gate rows first
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [hidden, intermediate]
    down_bias: torch.Tensor | None
    q_norm: torch.Tensor | None  # [head_dim] (Qwen3), permuted like q
    k_norm: torch.Tensor | None


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [vocab, hidden]
    layers: list[LayerWeights]
    norm: torch.Tensor
    lm_head: torch.Tensor  # [vocab, hidden]; the embedding itself when tied

    def nbytes(self) -> int:
        seen, total = set(), 0
        tensors = [self.embed, self.norm, self.lm_head]
        for lw in self.layers:
            tensors += [t for t in vars(lw).values() if t is not None]
        for t in tensors:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total


_ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "U8": torch.uint8,
              "I8": torch.int8, "I32": torch.int32, "I64": torch.int64}


class TensorReader:
    """Tensors by name across safetensors files. Each tensor is read with a plain file
    read into its own buffer rather than through a memory map: a mapped file's touched
    pages count as resident until it is closed, which would double peak memory while
    the fused copies are built (or, for packed weights, while each is copied out)."""

    def __init__(self, paths: list[Path], verify: bool = True):
        """`verify`: check each tensor against the CRC32 its file records (`write_file(checksums=
        True)`: a converted GGUF's weights, written by ktcli), as it is read: bytes changed in
        place (the file keeps its size, so the header's check of its length passes) were read
        as weights, packed and kept. ~0.16 s of CPU for a 538 MB float32 copy; files that
        record none (a model's own) cost nothing. Off for callers that check themselves."""
        self._where: dict[str, tuple[Path, int, dict]] = {}
        self._sums: dict[str, int] = {}
        self.metadata: dict[str, str] = {}
        for path in paths:
            header, base = read_header(path)
            meta = header.pop("__metadata__", None) or {}
            self.metadata.update(meta)
            sums = checksums_of(meta) if verify else None
            for name, info in header.items():
                self._where[name] = (path, base, info)
                if sums is not None and name in sums:
                    self._sums[name] = sums[name]
        self._files: dict[Path, object] = {}

    @classmethod
    def of_folder(cls, folder: Path) -> TensorReader:
        """The folder's safetensors files; a converted GGUF's own file where it has none
        (`gguf_weights`: the same names and values, dequantized as read)."""
        from ktcli.engine import gguf_weights

        if gguf_weights.linked_gguf(folder) is not None:
            return gguf_weights.GGUFTensors(folder)  # type: ignore[return-value]
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            mapping = json.loads(index.read_text())["weight_map"]
            files = sorted(set(mapping.values()))
        else:
            files = [p.name for p in sorted(folder.glob("*.safetensors"))]
        if not files:
            bins = any(folder.glob("*.bin"))
            raise UsageError(f"{folder}: no .safetensors weights" + (
                " (its PyTorch .bin weights: run it with --engine hf, or save it as safetensors)" if bins else ""))
        return cls([folder / f for f in files])

    def names(self) -> list[str]:
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise UsageError(f"weights lack tensor {name}")
        path, base, info = self._where[name]
        dtype = _ST_DTYPES.get(info["dtype"])
        if dtype is None:
            with safe_open(str(path), framework="pt") as h:  # rare dtypes: the library's reader
                return h.get_tensor(name).clone()
        begin, end = info["data_offsets"]
        out = torch.empty(info["shape"], dtype=dtype)
        fh = self._files.get(path) or self._files.setdefault(path, open(path, "rb"))
        fh.seek(base + begin)
        # Read straight into the tensor's memory (a uint8 view of the same bytes).
        if out.numel() * out.element_size() != end - begin:
            raise DamagedWeightsError(f"{path}: tensor {name} does not match its header (a damaged file)")
        got = fh.readinto(memoryview(out.view(-1).view(torch.uint8).numpy()))
        if got != end - begin:  # cut short since it was opened: never hand out unread memory
            raise DamagedWeightsError(f"{path}: cut short while reading {name} (a damaged file)")
        if name in self._sums and crc32(out.view(-1).view(torch.uint8).numpy()) != self._sums[name]:
            raise DamagedWeightsError(f"{path}: tensor {name} changed since it was written (a damaged file)")
        return out

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def __enter__(self) -> TensorReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.get(name) if name in self._where else None


def _permute_heads(w: torch.Tensor, n_heads: int, head_dim: int, perm: torch.Tensor) -> torch.Tensor:
    """Reorder each head's rows (dim 0) from half-split to interleaved pairs."""
    rest = w.shape[1:]
    # [heads * D, ...] -> [heads, D, ...] -> permute D -> [heads * D, ...]
    return w.reshape(n_heads, head_dim, *rest)[:, perm].reshape(n_heads * head_dim, *rest)


def load_weights(folder: Path, cfg: ModelConfig, weights: str = "fp32", device: torch.device | str = "cpu") -> ModelWeights:
    """`device`: each tensor is cast and moved on its own, so host memory holds at most
    one layer's worth of staging copies."""
    if weights not in DTYPES:
        raise UsageError(f"--weights {weights}: choose one of {', '.join(DTYPES)}")
    dtype = DTYPES[weights]
    device = torch.device(device)
    r = TensorReader.of_folder(Path(folder))
    perm = interleave_permutation(cfg.head_dim)
    f32 = torch.float32

    if dtype == torch.uint8:
        if device.type != "cpu":
            raise UsageError("--weights int8 runs on the CPU only (on a GPU use bf16)")
        misfit = int8_gemv.misfit_width(cfg)
        if misfit is not None:
            raise UsageError(f"--weights int8 needs layer widths that are multiples of {int8_gemv.GROUP} "
                             f"(this model has {misfit}); use bf16")

    def mat(t: torch.Tensor) -> torch.Tensor:
        if dtype == torch.uint8:
            return int8_gemv.pack(t)
        return t.to(device=device, dtype=dtype).contiguous()

    def vec(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(device=device, dtype=f32).contiguous()

    layers = []
    for i in range(cfg.n_layers):
        p = f"model.layers.{i}."
        q = _permute_heads(r.get(p + "self_attn.q_proj.weight"), cfg.n_heads, cfg.head_dim, perm)
        k = _permute_heads(r.get(p + "self_attn.k_proj.weight"), cfg.n_kv_heads, cfg.head_dim, perm)
        v = r.get(p + "self_attn.v_proj.weight")
        bias = None
        if cfg.qkv_bias:
            qb = _permute_heads(r.get(p + "self_attn.q_proj.bias"), cfg.n_heads, cfg.head_dim, perm)
            kb = _permute_heads(r.get(p + "self_attn.k_proj.bias"), cfg.n_kv_heads, cfg.head_dim, perm)
            bias = torch.cat([qb, kb, r.get(p + "self_attn.v_proj.bias")])
        gate_up = torch.cat([r.get(p + "mlp.gate_proj.weight"), r.get(p + "mlp.up_proj.weight")])
        gu_bias = None
        if cfg.mlp_bias:
            gu_bias = torch.cat([r.get(p + "mlp.gate_proj.bias"), r.get(p + "mlp.up_proj.bias")])
        q_norm = k_norm = None
        if cfg.qk_norm:
            q_norm = r.get(p + "self_attn.q_norm.weight")[perm]
            k_norm = r.get(p + "self_attn.k_norm.weight")[perm]
        layers.append(
            LayerWeights(
                in_norm=vec(r.get(p + "input_layernorm.weight")),
                qkv=mat(torch.cat([q, k, v])),
                qkv_bias=vec(bias),
                o=mat(r.get(p + "self_attn.o_proj.weight")),
                o_bias=vec(r.maybe(p + "self_attn.o_proj.bias")) if cfg.o_bias else None,
                post_norm=vec(r.get(p + "post_attention_layernorm.weight")),
                gate_up=mat(gate_up),
                gate_up_bias=vec(gu_bias),
                down=mat(r.get(p + "mlp.down_proj.weight")),
                down_bias=vec(r.maybe(p + "mlp.down_proj.bias")) if cfg.mlp_bias else None,
                q_norm=vec(q_norm),
                k_norm=vec(k_norm),
            )
        )
    embed = mat(r.get("model.embed_tokens.weight"))
    # A config that says its head is its own and weights without it are refused (as a
    # missing q_proj is): tied silently, our answers differed from transformers', which
    # starts such a head at random. A config that does not say: tied, as most releases are.
    if cfg.tie_embeddings or (cfg.tie_embeddings is None and not r.has("lm_head.weight")):
        lm_head = embed
    else:
        lm_head = mat(r.get("lm_head.weight"))
    norm = vec(r.get("model.norm.weight"))
    r.close()
    return ModelWeights(embed=embed, layers=layers, norm=norm, lm_head=lm_head)
