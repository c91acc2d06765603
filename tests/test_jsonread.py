"""jobprof.files.jsonread: orjson where it accepts the input, the standard library for the rest;
the values are json.loads' either way, and so is every model built from them."""

from __future__ import annotations

import json

import pytest

from jobprof.files import jsonread

ACCEPTED_BY_BOTH = [
    b'{"a": 1, "b": [1.5, -0.0, 1e-300, 123456789012345678], "c": "\\u00e9\\ud83d\\ude00", "d": null}',
    b'{"k": 1, "k": 2}',  # a duplicate key: the last wins in both
    b"[0.1, 0.30000000000000004, 2.5e-5, 1E+16, 9007199254740993]",
    b'"x"',
]
#: refused by orjson, decided by json: NaN / Infinity (Kineto writes them), UTF-16 with a BOM
REFUSED_BY_ORJSON = [
    b'{"dur": NaN, "ts": Infinity, "x": -Infinity}',
    '{"a": 1}'.encode("utf-16"),
]
#: read by orjson as floats, silently: jsonread hands them to json
WIDE = [b"[123456789012345678901234567890]", b"[18446744073709551616]", b"[-9223372036854775809]",
        b'{"ts_ns": 1733281728123456789, "neg": -1}']


@pytest.mark.parametrize("data", ACCEPTED_BY_BOTH + REFUSED_BY_ORJSON + WIDE)
def test_the_values_are_json_loads(data: bytes) -> None:
    got, want = jsonread.loads(data), json.loads(data)
    assert json.dumps(got) == json.dumps(want)
    assert type(got) is type(want)


def test_what_orjson_refuses_is_decoded_by_json() -> None:
    fast = jsonread._fast()
    assert fast is not None, "orjson is a dependency of jobprof"
    for data in REFUSED_BY_ORJSON:
        with pytest.raises(fast.JSONDecodeError):
            fast.loads(data)


@pytest.mark.parametrize("data", [b"", b"{", b'{"a": tru}', b"[1,]", b"\xff\xfe\x00"])
def test_bad_input_raises_as_json_does(data: bytes) -> None:
    with pytest.raises(ValueError):
        jsonread.loads(data)


def test_nesting_beyond_the_parser_raises_recursion_error_as_json_does() -> None:
    with pytest.raises(RecursionError):
        jsonread.loads(b"[" * 100_000 + b"]" * 100_000)


def test_wide_integers_stay_integers() -> None:
    for data in WIDE:
        assert jsonread.loads(data) == json.loads(data)
        assert jsonread.loads(data.decode()) == json.loads(data)


def test_without_orjson_it_is_the_standard_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonread, "_fast", lambda: None)
    assert jsonread.loads(ACCEPTED_BY_BOTH[0]) == json.loads(ACCEPTED_BY_BOTH[0])
