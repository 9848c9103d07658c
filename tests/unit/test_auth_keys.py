"""Key documents (ingress/auth.py): what is accepted, and errors that name the field and never the
key; the gate's 401/403 decisions and where it finds a key in HTTP headers and gRPC metadata."""

import json
import os
from pathlib import Path

import pytest

from lumenrt.ingress.auth import GROUPS, Gate, KeyFileError, KeySource, key_digest, key_source, parse_keys
from lumenrt.protocols.errors import ServerError

SECRET = "s3cret-value-that-is-long-enough"


def test_keys_are_found_by_value_or_by_their_sha256() -> None:
    keys = parse_keys(
        {
            "keys": [
                {"name": "a", "key": SECRET, "groups": ["inference"]},
                {"name": "b", "sha256": key_digest("other-key-long-enough-1234").hex(), "groups": ["*"]},
            ]
        },
        "f",
    )
    a = keys.find(SECRET.encode())
    assert a is not None and a.name == "a" and a.groups == frozenset({"inference"})
    b = keys.find(b"other-key-long-enough-1234")
    assert b is not None and b.groups == frozenset(GROUPS)
    assert keys.find(b"nope") is None and keys.find(b"") is None and keys.find(b"x" * 10_000) is None
    assert keys.plaintext


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ({"keys": []}, "keys: must be a non-empty list"),
        (
            {"keys": [{"name": "a", "key": "short", "groups": ["*"]}]},
            "keys[0] ('a').key: must be a string of 16",
        ),
        ({"keys": [{"name": "a", "key": SECRET}]}, "keys[0].groups: must be a non-empty list"),
        ({"keys": [{"name": "a", "key": SECRET, "groups": ["infer"]}]}, "unknown endpoint group 'infer'"),
        (
            {"keys": [{"name": "a", "key": SECRET, "sha256": "00", "groups": ["*"]}]},
            "exactly one of key and sha256",
        ),
        ({"keys": [{"name": "a", "sha256": "zz", "groups": ["*"]}]}, "sha256: must be 64 hex digits"),
        (
            {
                "keys": [
                    {"name": "a", "key": SECRET, "groups": ["*"]},
                    {"name": "a", "key": SECRET + "x", "groups": ["*"]},
                ]
            },
            "keys[1].name: 'a' is given twice",
        ),
        (
            {
                "keys": [
                    {"name": "a", "key": SECRET, "groups": ["*"]},
                    {"name": "b", "key": SECRET, "groups": ["*"]},
                ]
            },
            "the same key as 'a'",
        ),
        ({"keys": [{"name": "a", "key": SECRET, "groups": ["*"], "role": "x"}]}, "unknown field(s) ['role']"),
        ({"key": []}, "must be a mapping with one entry, 'keys'"),
    ],
)
def test_a_bad_document_names_the_field_and_never_a_key(doc: dict[str, object], expected: str) -> None:
    with pytest.raises(KeyFileError) as bad:
        parse_keys(doc, "keys.yaml")
    assert expected in str(bad.value)
    assert SECRET not in str(bad.value)


def test_bad_yaml_is_reported_without_an_excerpt(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"keys:\n  - name: a\n    key: {SECRET}\n   groups: [*]\n")
    with pytest.raises(KeyFileError) as bad:
        KeySource(path=path).load()
    assert "not valid YAML or JSON at line" in str(bad.value) and SECRET not in str(bad.value)


def test_the_environment_or_a_file_but_not_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = json.dumps({"keys": [{"name": "a", "key": SECRET, "groups": ["*"]}]})
    monkeypatch.delenv("LUMENRT_API_KEYS", raising=False)
    assert key_source(None) is None
    monkeypatch.setenv("LUMENRT_API_KEYS", doc)
    source = key_source(None)
    assert source is not None and source.load().find(SECRET.encode()) is not None
    with pytest.raises(KeyFileError, match="both given"):
        key_source(tmp_path / "k.json")
    assert os.environ["LUMENRT_API_KEYS"] == doc


def _gate(open_groups: list[str]) -> Gate:
    doc = {"keys": [{"name": "app", "key": SECRET, "groups": ["inference"]}]}
    return Gate(KeySource(env_text=json.dumps(doc)), open_groups)


def test_the_gate_answers_401_without_a_key_403_outside_its_groups() -> None:
    gate = _gate(["health"])
    key, presented = gate.from_headers({b"authorization": b"Bearer " + SECRET.encode()})
    assert presented and key is not None
    assert gate.check("inference", key, presented) is key
    with pytest.raises(ServerError) as forbidden:
        gate.check("model-repository", key, presented)
    assert forbidden.value.status == 403 and "'app'" in forbidden.value.message
    with pytest.raises(ServerError) as missing:
        gate.check("inference", None, False)
    assert missing.value.status == 401
    assert gate.check("health", None, False) is None
    assert gate.refused == {"unauthenticated": 1, "forbidden": 1}


def test_where_the_key_is_found() -> None:
    gate = _gate([])
    secret = SECRET.encode()
    assert gate.from_headers({b"authorization": b"bearer " + secret})[0] is not None  # scheme: any case
    assert gate.from_headers({b"x-api-key": secret})[0] is not None
    assert gate.from_headers({b"authorization": b"Basic " + secret}) == (None, False)
    assert gate.from_headers({}) == (None, False)
    assert gate.from_metadata([("authorization", "Bearer " + SECRET)])[0] is not None
    assert gate.from_metadata([("x-api-key", SECRET)])[0] is not None
    assert gate.from_metadata([("x-api-key", "wrong-key-0123456789")]) == (None, True)
    assert gate.from_metadata(None) == (None, False)
