"""The config file's ``server`` section: every ``lumenrt serve`` flag by name, checked as the flag is
(errors name ``server.<key>``), unknown keys named, the command line over the file over defaults."""

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from lumenrt.engine.config import ConfigError
from lumenrt.ingress.serve import add_arguments
from lumenrt.ingress.serve_config import FLAGS_ATTR, NOT_KEYS, apply_server_section
from lumenrt.observability.logging import REDACTED, redacted


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p


def parse(argv: list[str], server: Any = None, tmp_path: Path | None = None) -> argparse.Namespace:
    """``lumenrt serve ARGV`` with a config file holding ``server`` (None: no file)."""
    if server is not None:
        assert tmp_path is not None
        path = tmp_path / "lumenrt.yaml"
        path.write_text(yaml.safe_dump({"server": server}))
        argv = [*argv, "--config", str(path)]
    args = parser().parse_args(argv)
    apply_server_section(args)
    return args


def flag_dests() -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser()._actions if a.option_strings and a.dest not in NOT_KEYS}


# A valid file value for each flag and what the parsed namespace then holds. A flag added to
# `lumenrt serve` without a row here fails test_every_flag_is_accepted_from_the_file.
SAMPLES: dict[str, tuple[Any, Any]] = {
    "host": ("0.0.0.0", "0.0.0.0"),
    "http_port": (9000, 9000),
    "grpc_port": ("off", None),
    "grpc_server": ("grpcio", "grpcio"),
    "tcp_port": (0, 0),
    "repository": ("models", "RELATIVE:models"),
    "models": (["digits_mlp"], ["digits_mlp"]),
    "cache_size_bytes": (1 << 20, 1 << 20),
    "metrics_port": (9002, 9002),
    "no_metrics": (True, True),
    "workers": (2, 2),
    "mode": ("process", "process"),
    "queue_type": ("naive", "naive"),
    "allocator": ("standard", "standard"),
    "batch_size": (4, 4),
    "spin_us": (10, 10),
    "loop_spin_us": (200, 200),
    "lane": ("queue", "queue"),
    "batching": ("fixed", "fixed"),
    "no_pin": (True, True),
    "placement": ("pack", "pack"),
    "placement_strict": (True, True),
    "memory_binding": ("first_touch", "first_touch"),
    "max_body_bytes": (1024, 1024),
    "max_elements": (100, 100),
    "receive_timeout_s": (5, 5.0),
    "idle_timeout_s": (1.5, 1.5),
    "grace_s": (2, 2.0),
    "drain_delay_s": (1, 1.0),
    "model_dir": ("/mnt/models", Path("/mnt/models")),
    "model_name": ("iris", "iris"),
    "log_format": ("json", "json"),
    "log_level": ("debug", "debug"),
    "access_log": ("-", "-"),
    "trace": ("http://127.0.0.1:4318/v1/traces", "http://127.0.0.1:4318/v1/traces"),
    "api_keys": ("keys.yaml", "RELATIVE:keys.yaml"),
    "open_groups": (["health", "metrics"], ["health", "metrics"]),
    "api_key_header": ("admin-key", "admin-key"),
    "rate_limit": (50, 50.0),
    "max_connections_per_client": (16, 16),
    "allow_client_shm": (True, True),
    "max_shm_regions_per_client": (8, 8),
    "client_shm_prefix": ("/app-", "app-"),
    "tls_cert": ("server.crt", "RELATIVE:server.crt"),
    "tls_key": ("server.key", "RELATIVE:server.key"),
    "tls_client_ca": ("ca.crt", "RELATIVE:ca.crt"),
}


def test_every_flag_is_accepted_from_the_file(tmp_path: Path) -> None:
    dests = flag_dests()
    missing = sorted(set(dests) - set(SAMPLES))
    assert not missing, f"add a sample value for these serve flags: {missing}"
    server = {k: v for k, (v, _) in SAMPLES.items() if k in dests}
    args = parse([], server, tmp_path)
    for key, (_, expected) in SAMPLES.items():
        if key not in dests:
            continue
        if isinstance(expected, str) and expected.startswith("RELATIVE:"):  # relative to the file's folder
            expected = tmp_path / expected.removeprefix("RELATIVE:")
        assert getattr(args, key) == expected, key


def test_without_a_file_every_flag_has_its_default() -> None:
    args = parse([])
    for dest, action in flag_dests().items():
        assert getattr(args, dest) == getattr(args, FLAGS_ATTR).flags[dest].default, dest
        assert action.default is argparse.SUPPRESS  # deferred to apply_server_section
    assert (args.http_port, args.log_level, args.access_log, args.no_pin) == (8000, "info", None, False)


def test_command_line_overrides_the_file(tmp_path: Path) -> None:
    server = {"http_port": 9000, "tcp_port": 9003, "log_level": "debug", "no_pin": True}
    args = parse(["--http-port", "8000", "--log-level", "warning"], server, tmp_path)
    assert (args.http_port, args.log_level) == (8000, "warning")  # given: the command line wins
    assert (args.tcp_port, args.no_pin) == (9003, True)  # not given: the file


def test_the_file_does_not_override_a_flag_given_with_its_default_value(tmp_path: Path) -> None:
    args = parse(["--grpc-port", "8001"], {"grpc_port": 9001}, tmp_path)
    assert args.grpc_port == 8001


@pytest.mark.parametrize(
    ("server", "field", "problem"),
    [
        ({"http_port": 70000}, "server.http_port", "port must be 0..65535 or 'off'"),
        ({"http_port": "eighty"}, "server.http_port", "port must be 0..65535 or 'off'"),
        ({"grpc_port": False}, "server.grpc_port", "quote it"),  # YAML's bare `off`
        ({"workers": "2"}, "server.workers", "must be an integer, got '2' (str)"),
        ({"workers": 2.5}, "server.workers", "must be an integer"),
        ({"grace_s": "soon"}, "server.grace_s", "must be a number"),
        ({"mode": "fork"}, "server.mode", "must be one of thread, process"),
        ({"log_level": "verbose"}, "server.log_level", "must be one of debug, info, warning, error"),
        ({"no_pin": "yes"}, "server.no_pin", "must be true or false"),
        ({"models": "digits_mlp"}, "server.models", "must be a list"),
        ({"models": ["a", 3]}, "server.models[1]", "must be a string"),
        ({"cache_size_bytes": -1}, "server.cache_size_bytes", "whole number of bytes >= 0"),
        ({"repository": ""}, "server.repository", "must be a path"),
        ({"http-port": 1}, "server.http-port", "did you mean 'http_port'"),
        ({"config": "other.yaml"}, "server.config", "unknown key"),
        ({"help": True}, "server.help", "unknown key"),
        ([1, 2], "server", "must be a mapping"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, server: Any, field: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse([], server, tmp_path)
    assert caught.value.field == field
    assert problem in caught.value.problem
    assert caught.value.source == str(tmp_path / "lumenrt.yaml")


def test_unknown_key_is_named_with_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        parse([], {"http_prot": 1}, tmp_path)
    message = str(caught.value)
    assert "server.http_prot: unknown key" in message and "did you mean 'http_port'" in message
    assert "access_log" in message  # the valid keys are listed


def test_server_and_engine_sections_live_side_by_side(tmp_path: Path) -> None:
    from lumenrt.engine.server_config import load_engine_config

    path = tmp_path / "lumenrt.yaml"
    path.write_text("engine: {queue_type: naive}\nserver: {http_port: 0}\n")
    args = parser().parse_args(["--config", str(path)])
    apply_server_section(args)
    assert args.http_port == 0
    assert load_engine_config(path).queue_type == "naive"


def test_an_empty_server_section_is_allowed(tmp_path: Path) -> None:
    path = tmp_path / "lumenrt.yaml"
    path.write_text("server:\n")
    args = parser().parse_args(["--config", str(path)])
    apply_server_section(args)
    assert args.http_port == 8000


def test_secrets_are_redacted_before_logging() -> None:
    shown = redacted({"auth_token": "s3cr3t", "tls_private_key": "k", "api_key": "x", "http_port": 1})
    assert shown == {"auth_token": REDACTED, "tls_private_key": REDACTED, "api_key": REDACTED, "http_port": 1}


def test_lumenrt_serve_refuses_a_bad_server_section_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lumenrt.cli import main

    path = tmp_path / "lumenrt.yaml"
    path.write_text("server:\n  http_port: 70000\n")
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"lumenrt serve: {path}: server.http_port: port must be 0..65535 or 'off', got '70000'\n"


def test_the_environment_gives_a_flag_between_the_command_line_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LUMENRT_<DEST>, as a container platform passes settings: read as the command line would."""
    path = tmp_path / "lumenrt.yaml"
    path.write_text("server: {http_port: 9000, grpc_port: 9001, log_format: text}\n")
    monkeypatch.setenv("LUMENRT_HTTP_PORT", "8080")
    monkeypatch.setenv("LUMENRT_GRPC_PORT", "off")
    monkeypatch.setenv("LUMENRT_DRAIN_DELAY_S", "2.5")
    monkeypatch.setenv("LUMENRT_API_KEYS", "keys: [{name: a, key: k}]")  # the keys, not --api-keys' file
    monkeypatch.setenv("LUMENRT_MODELS", "digits_mlp squeezenet")
    monkeypatch.setenv("LUMENRT_LOG_FORMAT", "json")
    args = parser().parse_args(["--config", str(path), "--log-format", "text"])
    origin = apply_server_section(args)
    assert (args.http_port, args.grpc_port, args.drain_delay_s, args.models) == (
        8080,
        None,
        2.5,
        ["digits_mlp", "squeezenet"],
    )
    assert (args.api_keys, origin["api_keys"]) == (None, "default")
    assert args.log_format == "text" and origin["log_format"] == "command line"
    assert origin["http_port"] == "$LUMENRT_HTTP_PORT"
    monkeypatch.setenv("LUMENRT_HTTP_PORT", "eighty")
    with pytest.raises(ConfigError, match=r"LUMENRT_HTTP_PORT: .*eighty"):
        parse([])
    monkeypatch.setenv("LUMENRT_HTTP_PORT", "8080")
    monkeypatch.setenv("LUMENRT_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match=r"LUMENRT_LOG_FORMAT: .*invalid choice"):
        parse([])
