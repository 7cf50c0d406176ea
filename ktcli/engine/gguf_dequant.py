"""GGUF tensor data to float32, for the tensor types llama.cpp's files mostly hold: the float
types, the legacy 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the 256-element
K-quant super-blocks of the Q4_K_M / Q5_K_M / Q6_K files (Q4_K, Q5_K, Q6_K).

Why our own: `gguf.dequantize` is fine, but the conversion it sits in (transformers' GGUF
loader) spent ~40 s of a first run on metadata walks around it; the dequantization itself is
a few vectorised numpy steps per type. Each type computes in float32 in the order ggml's
reference does (scale times code, plus or minus the offset), so the values are the ones
`gguf.dequantize` gives, bit for bit (`tests/engine/test_gguf_convert.py` checks it).

Block layouts (ggml's `block_*` structs, little-endian, fp16 scales):
- Q4_0: d, 16 bytes of nibbles (low nibbles are elements 0-15, high ones 16-31); (q - 8) * d
- Q4_1: d, m, 16 bytes of nibbles; q * d + m
- Q5_0: d, 32 high bits, 16 bytes of nibbles; (q - 16) * d
- Q5_1: d, m, 32 high bits, 16 bytes of nibbles; q * d + m
- Q8_0: d, 32 int8; q * d
- Q4_K: d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of
  nibbles (each 32 bytes: low nibbles one sub-block, high nibbles the next)
- Q5_K: as Q4_K with 32 bytes of fifth bits (bit j of byte l: sub-block j, element l)
- Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales, d
"""

from __future__ import annotations

import numpy as np

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = 0, 1, 2, 3, 6, 7, 8
Q4_K, Q5_K, Q6_K = 12, 13, 14
BF16 = 30

QK_K = 256  # elements in a K-quant super-block

# type -> (elements per block, bytes per block)
BLOCKS = {
    F32: (1, 4), F16: (1, 2), BF16: (1, 2),
    Q4_0: (32, 18), Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), Q8_0: (32, 34),
    Q4_K: (QK_K, 144), Q5_K: (QK_K, 176), Q6_K: (QK_K, 210),
}
NAMES = {F32: "F32", F16: "F16", BF16: "BF16", Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1",
         Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K"}


def supported(tensor_type: int) -> bool:
    return tensor_type in BLOCKS


def dequantize(data: np.ndarray, tensor_type: int, n_elements: int) -> np.ndarray:
    """`data` (the tensor's raw bytes, uint8) as `n_elements` float32 values, flat."""
    per_block, block_bytes = BLOCKS[tensor_type]
    raw = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    if n_elements % per_block or raw.size != n_elements // per_block * block_bytes:
        raise ValueError(f"{NAMES[tensor_type]} data of {raw.size} bytes does not hold {n_elements} elements")
    if tensor_type == F32:
        return raw.view(np.float32).copy()
    if tensor_type == F16:
        return raw.view(np.float16).astype(np.float32)
    if tensor_type == BF16:
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    blocks = raw.reshape(-1, block_bytes)
    return _BLOCK_READERS[tensor_type](blocks).reshape(-1)


def _fp16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The fp16 scale at byte `at` of each block, as float32 [n_blocks, 1]."""
    return np.ascontiguousarray(blocks[:, at:at + 2]).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes [n, k] -> their low nibbles then their high ones [n, 2k] (uint8)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """32 bits of each block (4 bytes, little-endian) -> [n, 32] of 0/1, bit j first."""
    return np.unpackbits(qh, axis=1, bitorder="little")


# The float32 values are scaled and offset in place (the same products and sums, so the same
# bits): the engine reads a converted GGUF's tensors as it loads (`gguf_weights`), beside the
# weights it has packed so far, and each float32 temporary of the embedding is ~110 MB there.


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    q = (_nibbles(blocks[:, 2:]).astype(np.int8) - np.int8(8)).astype(np.float32)
    q *= _fp16(blocks, 0)
    return q


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    q = _nibbles(blocks[:, 4:]).astype(np.float32)
    q *= _fp16(blocks, 0)
    q += _fp16(blocks, 2)
    return q


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    q = ((_nibbles(blocks[:, 6:]) | (_high_bits(blocks[:, 2:6]) << 4)).astype(np.int8) - np.int8(16)).astype(np.float32)
    q *= _fp16(blocks, 0)
    return q


def _q5_1(blocks: np.ndarray) -> np.ndarray:
    q = (_nibbles(blocks[:, 8:]) | (_high_bits(blocks[:, 4:8]) << 4)).astype(np.float32)
    q *= _fp16(blocks, 0)
    q += _fp16(blocks, 2)
    return q


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    q = np.ascontiguousarray(blocks[:, 2:]).view(np.int8).astype(np.float32)
    q *= _fp16(blocks, 0)
    return q


def _k_scales_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins per super-block.
    Sub-blocks 0-3 keep theirs in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins);
    sub-blocks 4-7 in the nibbles of bytes 8-11, with their top two bits in the top two
    bits of bytes 0-3 (scales) and 4-7 (mins)."""
    low, mid, top = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = np.concatenate([low & 63, (top & 0x0F) | ((low >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_codes_4bit(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> 8 sub-blocks of 32 four-bit codes [n, 8, 32]: each run of 32 bytes
    holds two sub-blocks, the low nibbles first."""
    runs = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([runs & 0x0F, runs >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    q = _k_codes_4bit(blocks[:, 16:144]).astype(np.float32)
    q *= (d * scales)[..., None]
    q -= (dmin * mins)[..., None]
    return q


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin = _fp16(blocks, 0), _fp16(blocks, 2)
    scales, mins = _k_scales_mins(blocks[:, 4:16])
    fifth = np.unpackbits(blocks[:, 16:48, None], axis=2, bitorder="little")  # [n, 32 elements, 8 sub-blocks]
    q = (_k_codes_4bit(blocks[:, 48:176]) | (fifth.transpose(0, 2, 1) << 4)).astype(np.float32)
    q *= (d * scales)[..., None]
    q -= (dmin * mins)[..., None]
    return q


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    d = _fp16(blocks, 208)
    scales = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.float32)  # one per 16 elements
    ql = blocks[:, 0:128].reshape(-1, 2, 2, 32)  # [half, first/second 32 bytes, byte]
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)  # [half, byte]
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # [half, 4 quarters of 32, element]
    high = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3
    # quarter order within a half: ql[0:32] low, ql[32:64] low, ql[0:32] high, ql[32:64] high
    q = (low | (high << 4)).astype(np.int8) - np.int8(32)
    q = q.reshape(-1, 16, 16).astype(np.float32)
    q *= (d * scales)[..., None]
    return q


_BLOCK_READERS = {Q4_0: _q4_0, Q4_1: _q4_1, Q5_0: _q5_0, Q5_1: _q5_1, Q8_0: _q8_0,
                  Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k}
