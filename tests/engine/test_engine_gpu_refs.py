"""benchmarks/engine_gpu.py's precomputed CPU references: the end-to-end part of the GPU
bench reads them instead of spending device time on CPU runs, refuses stale ones, and
runs the kinds the last GPU run skipped (int4, int8) first."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel import (the smoke runs)

import pytest  # noqa: E402
import torch  # noqa: E402

from benchmarks import engine_gpu as E  # noqa: E402


def test_int4_and_int8_run_first_on_fp32_weights():
    assert E.KINDS[:2] == ("int4", "int8") and set(E.KINDS) == {"fp32", "bf16", "fp8", "int8", "int4"}
    args = E._parse([])
    assert args.weights == "fp32"  # exactness: every kind meets its own CPU twin


def _doc(**key):
    args = E._parse([])
    k = E.refs_key(args, "abc")
    k.update(key)
    return {"key": k, "code": E.code_hashes(), "prompt": [1, 2, 3], "refs": {"int8/dense": [5, 6]}}


def test_stale_references_are_refused_and_say_why():
    args = E._parse([])
    key = E.refs_key(args, "abc")
    assert E.check_refs(None, key) == "no reference file"
    assert E.check_refs(_doc(), key) is None
    assert "model_sha256" in E.check_refs(_doc(model_sha256="other"), key)
    assert "new_tokens" in E.check_refs(_doc(new_tokens=16), key)
    assert "load" in E.check_refs(_doc(load={"prefill_chunk": 256}), key)
    changed = _doc()
    changed["code"]["kernels/reference.py"] = "0" * 16
    why = E.check_refs(changed, key)
    assert why and "kernels/reference.py" in why and "--make-refs" in why
    assert E.check_refs(changed, key, ignore_code=True) is None
    # The Triton kernels and the bench are no part of the CPU path: they may change.
    assert "kernels/bench.py" not in E.code_hashes() and "kernels/paged_attention.py" not in E.code_hashes()
    assert "kernels/reference.py" in E.code_hashes() and "ktcli/engine/longctx.py" in E.code_hashes()


def test_matches_against_references_by_page_kind():
    rows = [{"kind": "int8", "policy": "dense", "weights": "fp32", "tokens": [1, 2, 3, 4]},
            {"kind": "bf16", "policy": "dense", "weights": "bf16", "tokens": [1, 2, 9, 4]},
            {"kind": "int4", "policy": "topk", "weights": "fp32", "tokens": [1, 2, 3, 4]}]
    refs = {"int8/dense": [1, 2, 3, 5], "fp32/dense": [1, 2, 3, 4]}
    E.attach_matches(rows, refs)
    assert (rows[0]["match_same"], rows[0]["prefix_same"], rows[0]["match_fp32"]) == (0.75, 3, 1.0)
    assert (rows[1]["match_same"], rows[1]["prefix_same"]) == (0.75, 2)  # bf16 weights: vs fp32 pages
    assert rows[2]["match_same"] is None and rows[2]["ref_same"] == "no reference"


def test_key_weights_round_trip_exactly_and_reach_int4_loads(tmp_path):
    from ktcli.engine import key_calibration

    w = torch.rand(3, 2, 8) * 1e-3 + torch.tensor(1e-30)
    back = E._weights_from_json(json.loads(json.dumps(E._weights_to_json(w))))
    assert torch.equal(back.view(torch.int32), w.view(torch.int32))
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert E.use_key_weights(folder, {"int4_key_weights": E._weights_to_json(w)})
    try:  # what key_calibration.calibrate reads first: no measurement on the device
        assert torch.equal(key_calibration._memo[E._key_weights_key(folder)], w)
    finally:
        key_calibration._memo.pop(E._key_weights_key(folder), None)


def test_rematch_compares_a_device_run_with_later_references():
    doc = {"key": {"model_sha256": "abc"}, "prompt": [1, 2, 3], "refs": {"int8/dense": [4, 5]}, "made": {}}
    result = {"model_sha256": "abc", "prompt_sha256": E.prompt_sha256([1, 2, 3]),
              "rows": [{"kind": "int8", "policy": "dense", "weights": "fp32", "tokens": [4, 6]}]}
    assert E.rematch(result, doc)["rows"][0]["match_same"] == 0.5
    with pytest.raises(SystemExit):
        E.rematch(dict(result, prompt_sha256=E.prompt_sha256([1, 2])), doc)


@pytest.mark.slow  # ~1-2 min here: a tiny model, the Triton interpreter
def test_smoke_run_reads_precomputed_references_and_refuses_stale_ones(tmp_path):
    import kernels

    path = tmp_path / "refs.json"
    base = ["--smoke", "--kinds", "fp32,int8", "--policies", "dense", "--refs", str(path)]
    try:
        doc = E.make_refs(E._parse(base + ["--make-refs"]))
        assert set(doc["refs"]) == {"fp32/dense", "int8/dense"} and json.loads(path.read_text())["refs"] == doc["refs"]
        result = E.run(E._parse(base))
        assert result["refs"]["stale"] is None and result["cpu_refs_run"] == 0  # no CPU run in the device's time
        assert [(r["kind"], r["match_same"]) for r in result["rows"]] == [("fp32", 1.0), ("int8", 1.0)]
        stale = json.loads(path.read_text())
        stale["key"]["new_tokens"] += 1
        path.write_text(json.dumps(stale))
        result = E.run(E._parse(base))
        assert "new_tokens" in result["refs"]["stale"] and result["cpu_refs_run"] == 0
        assert all(r["tokens"] and r["match_same"] is None for r in result["rows"])  # tokens kept: --rematch
        result = E.run(E._parse(base + ["--recompute-refs"]))
        assert result["cpu_refs_run"] == 2 and all(r["match_same"] == 1.0 for r in result["rows"])
    finally:
        kernels.set_backend("auto")
