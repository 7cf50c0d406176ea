"""engine.gguf_header reads what gguf's own reader reads (metadata, tensor table, a
tensor's bytes) from the bundled GGUF and from written ones, and refuses damaged files
with ValueError, which the model store says in one line."""

from __future__ import annotations

import numpy as np
import pytest

from ktcli.engine import gguf_header, model_store
from ktcli.engine.gguf_header import SHORT_ARRAY, read_header
from tests.engine.conftest import build_tiny
from tests.engine.tiny_gguf import write_gguf


def _same_as_gguf_reader(path):
    import gguf

    theirs, ours = gguf.GGUFReader(str(path)), read_header(path)
    keys = {k for k in theirs.fields if not k.startswith("GGUF.")}  # the reader's own pseudo-fields
    assert keys == set(ours.fields)
    for key in keys:
        field, mine = theirs.fields[key], ours.fields[key]
        if mine.value is None:  # a long array: its length kept
            assert mine.length == len(field.data) > SHORT_ARRAY, key
        else:
            want = field.contents()
            assert mine.value == (pytest.approx(want) if isinstance(want, float) else want), key
    assert [(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset))
            for t in theirs.tensors] == [(t.name, t.shape, t.tensor_type, t.offset) for t in ours.tensors]
    last = theirs.tensors[-1]
    assert np.array_equal(np.asarray(last.data).view(np.uint8).reshape(-1), ours.tensors[-1].data)
    return ours


def test_the_bundled_gguf_reads_as_ggufs_reader_reads_it():
    header = _same_as_gguf_reader(model_store.resolve_model("smollm2").path)
    assert header.fields["tokenizer.ggml.tokens"].length == 49152
    assert header.fields["general.architecture"].contents() == "llama"


def test_a_written_gguf_with_short_arrays_and_rope_freqs_reads_the_same(tmp_path):
    import gguf

    path = write_gguf(build_tiny("llama", tmp_path / "llama"), tmp_path / "m.gguf",
                      rope_freqs=np.linspace(1.0, 8.0, 8, dtype=np.float32))
    header = _same_as_gguf_reader(path)
    freqs = next(t for t in header.tensors if t.name == "rope_freqs.weight")
    assert np.allclose(gguf.dequantize(freqs.data, freqs.tensor_type), np.linspace(1.0, 8.0, 8))


def test_planning_facts_from_the_gguf_need_no_tokenizer_walk():
    """4.8 s through gguf's reader on the 2-core machine; the header alone is enough."""
    facts = model_store._facts_from_gguf(model_store.resolve_model("smollm2"))
    assert (facts.vocab_size, facts.n_layers, facts.n_params) == (49152, 30, 134515008)


@pytest.mark.parametrize("damage", ["magic", "version", "cut", "tensors cut", "count"])
def test_a_damaged_gguf_is_a_value_error(tmp_path, damage):
    path = write_gguf(build_tiny("llama", tmp_path / "llama"), tmp_path / "m.gguf")
    data = bytearray(path.read_bytes())
    if damage == "magic":
        data[:4] = b"GGUX"
    elif damage == "version":
        data[4:8] = (7).to_bytes(4, "little")
    elif damage == "cut":
        data = data[:3000]  # inside the token list
    elif damage == "tensors cut":
        data = data[:-100]  # the metadata whole, the last tensor short
    else:  # a metadata count of 2^40: refused, not walked
        data[16:24] = (1 << 40).to_bytes(8, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError):
        gguf_header.read_header(path)
