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


def test_the_committed_references_cover_every_kind_and_policy():
    """The file the GPU run reads: each (kind, policy) it can run, 32 tokens each, for the
    settings the run uses (its code hashes are --check-refs' business: device_bench.sh
    split refuses to prepare a run with stale ones)."""
    doc = E.read_refs(E.REFS)
    assert doc is not None, f"{E.REFS} missing: python -m benchmarks.engine_gpu --make-refs"
    args = E._parse([])
    key = E.refs_key(args, doc["key"]["model_sha256"])
    assert E.check_refs(doc, key, ignore_code=True) is None
    assert set(doc["refs"]) == {f"{k}/{p}" for k in E.KINDS for p in E.POLICIES}
    assert all(isinstance(t, list) and len(t) == 32 for t in doc["refs"].values())
    # Teacher forcing's yardstick: each position's top-1 logit, top-2 id and logit.
    assert set(doc["logits"]) == set(doc["refs"])
    for cell, rows in doc["logits"].items():
        assert len(rows) == 32 and all(top1 >= top2 and id2 != tok
                                       for (top1, id2, top2), tok in zip(rows, doc["refs"][cell]))
    assert 1400 < len(doc["prompt"]) < 1700
    w = E._weights_from_json(doc["int4_key_weights"])  # sha256-checked
    assert w.dtype == torch.float32 and w.dim() == 3 and bool(torch.isfinite(w).all())


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
    assert E.code_changed(changed) == ["kernels/reference.py"]
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


def test_trace_forces_the_reference_tokens_and_records_its_own_argmax():
    logits = torch.tensor([[0.0, 3.0, 2.5, 1.0], [5.0, 0.0, 4.0, 4.0], [1.0, 1.0, 0.0, 0.5]])
    free = E._Trace()
    assert [free(row[None], None, [None]) for row in logits] == [[1], [0], [0]]  # ties: the first
    forced = E._Trace([2, 3, 1])
    assert [forced(row[None], None, [None]) for row in logits] == [[2], [3], [1]]  # what is fed on
    assert [r[0] for r in forced.rows] == [1, 0, 0] and [r[2] for r in forced.rows] == [2, 2, 1]
    assert [r[4] for r in forced.rows] == [2.5, 4.0, 1.0]  # its logit of the fed token


def test_forcing_figures_tell_a_near_tie_from_a_wide_miss():
    ref_tokens = [7, 8, 9]
    ref_logits = [[10.0, 3, 9.0], [6.0, 4, 5.9999], [4.0, 1, 2.0]]  # margins 1, 1e-4, 2
    trace = [[7, 10.0, 3, 9.0, 10.0], [4, 6.0, 8, 5.99, 5.9999], [1, 5.0, 9, 3.5, 3.5]]
    f = E.forcing_figures(trace, ref_logits, ref_tokens)
    assert f["teacher_forced"] and [p for p, _, _ in f["flips"]] == [1, 2]
    assert f["flips"][0][1] == pytest.approx(1e-4) and f["flips"][1][1] == 2.0 and f["flips"][1][2] == 1.5
    assert f["max_dlogit"] == pytest.approx(0.5) and f["min_ref_margin"] == pytest.approx(1e-4)
    rows = [dict(kind="int8", policy="dense", weights="fp32", tokens=[7, 4, 1], **f)]
    E.attach_matches(rows, {"int8/dense": ref_tokens, "fp32/dense": [7, 8, 5]})
    assert (rows[0]["match_same"], rows[0]["prefix_same"]) == (pytest.approx(1 / 3), 1)
    # Forced rows follow the int8 reference's context: vs fp32 is that reference's own.
    assert rows[0]["match_fp32"] == pytest.approx(2 / 3) and rows[0]["match_fp32_of"] == "cpu references"


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
        for r in result["rows"]:  # teacher forced; fp32 through the interpreter: logits agree closely
            assert r["teacher_forced"] and r["flips"] == [] and r["max_dlogit"] < 1e-3
        # Other engine sources: used on the device, said in the result; refused when strict.
        drifted = json.loads(path.read_text())
        drifted["code"]["kernels/reference.py"] = "0" * 16
        path.write_text(json.dumps(drifted))
        result = E.run(E._parse(base + ["--kinds", "fp32"]))
        assert result["refs"]["stale"] is None and result["refs"]["code_changed"] == ["kernels/reference.py"]
        assert result["rows"][0]["match_same"] == 1.0
        result = E.run(E._parse(base + ["--kinds", "fp32", "--strict-refs"]))
        assert "kernels/reference.py" in result["refs"]["stale"] and result["rows"][0]["match_same"] is None
        stale = json.loads(path.read_text())
        stale["key"]["new_tokens"] += 1
        path.write_text(json.dumps(stale))
        result = E.run(E._parse(base))
        assert "new_tokens" in result["refs"]["stale"] and result["cpu_refs_run"] == 0
        assert all(r["tokens"] and r["match_same"] is None for r in result["rows"])  # tokens kept: --rematch
        assert not any(r.get("teacher_forced") for r in result["rows"])  # nothing to force: free running
        result = E.run(E._parse(base + ["--recompute-refs"]))
        assert result["cpu_refs_run"] == 2 and all(r["match_same"] == 1.0 for r in result["rows"])
    finally:
        kernels.set_backend("auto")
