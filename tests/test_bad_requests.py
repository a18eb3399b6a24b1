"""One bad request must never crash the engine for everyone.

Every field of ``SamplingParams`` and ``add_request`` is checked where it enters: a wrong value is refused
with a ``ValueError`` naming the field, and nothing changes. And if a step still fails for one request (a bug,
not bad input), that request ends with finish reason ``"error"``, its blocks are freed, and every other request
goes on with exactly the tokens it would have had.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import alone, run_checked, tiny_engine
from minfer import SamplingParams
from minfer.plan import Ended

REF_PROMPT, REF_TOKENS = (5, 6, 7, 8), 10
REF = SamplingParams(max_tokens=REF_TOKENS, temperature=0, ignore_eos=True)


# ---- the cases the issue found, one by one ----------------------------------------------------------
@pytest.mark.parametrize("value", [1, True, 1.5, "x", b"ab", 2**63, [1.5], [True], [-1], {1: 2}])
def test_stop_token_ids_must_be_a_list_of_token_ids(value):
    with pytest.raises(ValueError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=value)


@pytest.mark.parametrize("value", [[1], (1, 2), b"ab", {1: 2}, [[1]], [1.0], [""], ""])
def test_stop_must_be_a_string_or_a_list_of_strings(value):
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=value)


@pytest.mark.parametrize("field, value", [
    ("temperature", 2**63), ("temperature", math.nan), ("temperature", math.inf), ("temperature", 10**400),
    ("temperature", True), ("temperature", "0.5"), ("top_p", math.nan), ("top_p", 0), ("top_p", [0.5]),
    ("top_k", 0), ("top_k", 1.5), ("top_k", True), ("max_tokens", 0), ("max_tokens", 2.0), ("max_tokens", None),
    ("seed", 1.5), ("seed", math.nan), ("seed", "x"), ("seed", [1]), ("seed", True), ("seed", -1), ("seed", 2**64),
    ("ignore_eos", 1), ("ignore_eos", "yes"),
])
def test_each_field_is_checked_when_built(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_values_are_normalized():
    p = SamplingParams(stop="end", stop_token_ids=(3, 4), temperature=1, top_p=1)
    assert p.stop == ["end"] and p.stop_token_ids == [3, 4]
    assert type(p.temperature) is float and type(p.top_p) is float


def test_vocabulary_limits_are_checked_when_added(tiny):
    e = tiny_engine(tiny, num_blocks=16)
    for params, field in ((SamplingParams(top_k=2**63), "top_k"), (SamplingParams(top_k=321), "top_k"),
                          (SamplingParams(stop_token_ids=[320]), "stop_token_ids")):
        with pytest.raises(ValueError, match=field):
            e.add_request("r", [5], params)
    e.add_request("ok", [5], SamplingParams(top_k=320, stop_token_ids=[319], max_tokens=3))
    assert run_checked(e)["ok"].outputs[0].finish_reason in ("length", "stop")


@pytest.mark.parametrize("kwargs, field", [
    (dict(request_id=None), "request_id"), (dict(request_id=[]), "request_id"), (dict(request_id={}), "request_id"),
    (dict(request_id=1.5), "request_id"), (dict(request_id=b"ab"), "request_id"), (dict(request_id=""), "request_id"),
    (dict(arrival_time=True), "arrival_time"), (dict(arrival_time=-2**63), "arrival_time"),
    (dict(arrival_time=math.nan), "arrival_time"), (dict(arrival_time="0"), "arrival_time"),
    (dict(priority=True), "priority"), (dict(priority=2**40), "priority"), (dict(priority=1.0), "priority"),
    (dict(tenant=""), "tenant"), (dict(tenant=7), "tenant"), (dict(params={"max_tokens": 3}), "params"),
    (dict(prompt=b"ab"), "prompt"), (dict(prompt=[True]), "prompt"), (dict(prompt=[1.0]), "prompt"),
    (dict(prompt=[-1]), "prompt"), (dict(prompt=[[1]]), "prompt"), (dict(prompt=None), "prompt"),
])
def test_add_request_checks_every_argument(tiny, kwargs, field):
    e = tiny_engine(tiny, num_blocks=16)
    e.add_request("ok", list(REF_PROMPT), REF)
    args = dict(request_id="bad", prompt=[5, 6], params=None) | kwargs
    with pytest.raises(ValueError, match=field):
        e.add_request(args.pop("request_id"), args.pop("prompt"), args.pop("params"), **args)
    assert list(e.scheduler.requests) == ["ok"]
    assert run_checked(e)["ok"].outputs[0].token_ids == list(alone(REF_PROMPT, REF_TOKENS))


def test_the_engine_keeps_its_own_copy_of_the_params(tiny):
    """Changing the caller's SamplingParams after add_request cannot reach the running request."""
    expected = list(alone(REF_PROMPT, REF_TOKENS))
    e = tiny_engine(tiny, num_blocks=16)
    never = min(set(range(3, 320)) - set(expected))  # a stop token the request never samples
    params = SamplingParams(max_tokens=REF_TOKENS, temperature=0, ignore_eos=True, stop_token_ids=[never])
    e.add_request("r", list(REF_PROMPT), params)
    params.stop_token_ids = 1  # would crash the stop check of every step if the engine read this object
    params.max_tokens = 1
    assert run_checked(e)["r"].outputs[0].token_ids == expected


# ---- defence in depth: a failure inside a step fails one request only ------------------------------------
def others(tiny, **config) -> dict:
    e = tiny_engine(tiny, num_blocks=32, max_num_seqs=4, chunked_prefill_size=8, **config)
    for i in range(5):
        e.add_request(f"r{i}", [10 + i] * (3 + 4 * i), SamplingParams(max_tokens=8 + i, temperature=0, ignore_eos=True))
    return e


def test_a_request_that_breaks_the_forward_pass_fails_alone(tiny, caplog):
    expected = {rid: o.outputs[0].token_ids for rid, o in run_checked(others(tiny)).items()}
    e = others(tiny)
    e.add_request("bad", [9] * 11, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    real = e.executor.execute
    calls = []

    def broken(out):  # a bug only this request triggers, once it decodes
        calls.append(len(out.chunks))
        bad = [c for c in out.chunks if c.request.request_id == "bad"]
        if bad and bad[0].is_decode:
            raise RuntimeError("simulated kernel fault")
        return real(out)

    e.executor.execute = broken
    final = run_checked(e)
    bad = final.pop("bad").outputs[0]
    assert bad.finish_reason == "error" and bad.stop_reason == "RuntimeError: simulated kernel fault"
    assert len(bad.token_ids) == 1, "it got its first token, then its next step failed"
    assert {rid: o.outputs[0].token_ids for rid, o in final.items()} == expected
    assert [d for t in e.trace for d in t.decisions if d.request == "bad" and d.kind == "ended"] == [
        Ended("bad", "error", "error", "RuntimeError: simulated kernel fault")]
    assert "simulated kernel fault" in caplog.text
    assert max(calls) > 1, "the failing step held other requests too"


def test_a_tokenizer_failure_fails_that_request_only(tiny):
    e = others(tiny)
    e.add_request("bad", [9] * 5, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    decode = e.detokenizer.tokenizer.decode
    bad_req = e.scheduler.requests["bad"]

    def fragile(ids):
        if ids is bad_req.output_token_ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "simulated")
        return decode(ids)

    e.detokenizer.tokenizer = type("T", (), {"decode": staticmethod(fragile)})()
    final = run_checked(e)
    assert final["bad"].outputs[0].finish_reason == "error"
    assert all(o.outputs[0].finish_reason == "length" for rid, o in final.items() if rid != "bad")


# ---- the property: any value, in any field ------------------------------------------------------------
ODD = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**62, max_value=2**70).map(lambda x: -x),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4), st.binary(max_size=3),
    st.lists(st.one_of(st.integers(-2, 400), st.text(max_size=2), st.floats()), max_size=3),
    st.tuples(st.integers(0, 5), st.integers(0, 5)), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.lists(st.lists(st.integers(0, 5), max_size=2), max_size=2),
)
SANE = {  # values a field accepts (the tiny model's vocabulary is 320)
    "max_tokens": st.integers(1, 20) | st.integers(1, 2**70),
    "temperature": st.sampled_from([0.0, 0.7, 1.0, 100.0]),
    "top_p": st.floats(0.01, 1.0),
    "top_k": st.sampled_from([-1, 1, 5, 320]),
    "seed": st.none() | st.integers(0, 2**63 - 1),
    "stop": st.none() | st.sampled_from(["a", ["\x05", "zz"]]),
    "stop_token_ids": st.none() | st.lists(st.integers(0, 319), max_size=3),
    "ignore_eos": st.booleans(),
}
ADD = {
    "request_id": st.sampled_from(["x", "ok"]),
    "prompt": st.lists(st.integers(0, 319), min_size=1, max_size=20) | st.text(max_size=8),
    "priority": st.integers(-(2**31), 2**31 - 1),
    "tenant": st.none() | st.sampled_from(["a", "b"]),
    "arrival_time": st.none() | st.floats(0, 0.5),
}


def sometimes_odd(sane: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(sane, sane, ODD)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(params=st.fixed_dictionaries({k: sometimes_odd(v) for k, v in SANE.items()}),
       add=st.fixed_dictionaries({k: sometimes_odd(v) for k, v in ADD.items()}))
def test_any_value_is_refused_cleanly_or_served(tiny, params, add):
    e = tiny_engine(tiny, num_blocks=24, max_model_len=48)
    e.add_request("ok", list(REF_PROMPT), REF)
    try:
        p = SamplingParams(**params)
    except ValueError as err:
        assert any(field in str(err) for field in params), f"{err} names no field"
        return
    try:
        e.add_request(add["request_id"], add["prompt"], p, priority=add["priority"], tenant=add["tenant"],
                      arrival_time=add["arrival_time"])
        served = True
    except ValueError as err:
        assert any(f in str(err) for f in (*ADD, "params", "prompt", "top_k", "stop_token_ids", "max_model_len",
                                            "num_blocks")), f"{err} names no field"
        served = False
    final = run_checked(e)  # check_invariants after every step, and the pool empty at the end
    assert final["ok"].outputs[0].token_ids == list(alone(REF_PROMPT, REF_TOKENS))
    if served and add["request_id"] != "ok":
        assert final[add["request_id"]].outputs[0].finish_reason in ("stop", "length")


def test_a_token_list_is_checked_in_bulk_but_a_refusal_names_the_entry():
    """Plain ints take the fast path; NumPy ints and a bad entry go element by element."""
    import numpy as np

    from minfer import input_checks

    assert input_checks.integer_list("ids", (3, 4, 5), 0, 9) == [3, 4, 5]
    converted = input_checks.integer_list("ids", [np.int64(3), 4], 0, 9)
    assert converted == [3, 4] and all(type(v) is int for v in converted)
    for bad, entry in (([1] * 500 + [10], "ids[500]"), ([1, True], "ids[1]"), ([-1, 2], "ids[0]")):
        with pytest.raises(ValueError, match=re.escape(entry)):
            input_checks.integer_list("ids", bad, 0, 9)
