"""``lumenrt serve``'s key and rate-limit settings, refused before any model loads when they cannot
be used: exit 2 and one line that names the flag or the field, never a key's text."""

import json
from pathlib import Path

import pytest

from lumenrt import cli

SECRET = "a-secret-key-that-is-long-enough"


def serve(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = cli.main(["serve", "--http-port", "0", "--grpc-port", "off", "--tcp-port", "off", *args])
    return status, capsys.readouterr().err


@pytest.fixture(autouse=True)
def no_env_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LUMENRT_API_KEYS", raising=False)


def test_a_bad_key_file_is_named_without_its_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "a", "key": SECRET, "groups": ["inferense"]}]}))
    status, err = serve(["--api-keys", str(keys)], capsys)
    assert status == 2
    assert "keys[0].groups: unknown endpoint group 'inferense'" in err and SECRET not in err
    status, err = serve(["--api-keys", str(tmp_path / "missing.yaml")], capsys)
    assert status == 2 and "missing.yaml: cannot read" in err


def test_keys_in_both_the_environment_and_a_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "LUMENRT_API_KEYS", json.dumps({"keys": [{"name": "a", "key": SECRET, "groups": ["*"]}]})
    )
    status, err = serve(["--api-keys", str(tmp_path / "k.json")], capsys)
    assert status == 2 and "--api-keys and $LUMENRT_API_KEYS are both given" in err


def test_a_separate_metrics_port_needs_the_metrics_group_open(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "LUMENRT_API_KEYS", json.dumps({"keys": [{"name": "a", "key": SECRET, "groups": ["*"]}]})
    )
    status, err = serve(["--metrics-port", "0"], capsys)
    assert status == 2 and "--metrics-port serves the metrics without a key check" in err


def test_bad_rate_limits_name_the_flag_or_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, err = serve(["--rate-limit", "0"], capsys)
    assert status == 2 and "--rate-limit must be > 0" in err
    config = tmp_path / "lumenrt.yaml"
    config.write_text("rate_limits:\n  models:\n    digits_mlp: {requests_per_s: -1}\n")
    status, err = serve(["--config", str(config)], capsys)
    assert status == 2 and "rate_limits.models.digits_mlp.requests_per_s: must be a number > 0" in err


def test_open_groups_are_checked_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--open-groups", "helth"])
    assert exited.value.code == 2
    assert "invalid choice: 'helth'" in capsys.readouterr().err
