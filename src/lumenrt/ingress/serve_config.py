"""The ``server`` section of the config file: every ``lumenrt serve`` flag, by its dest name.

    server:
      http_port: 8000          # --http-port
      grpc_port: "off"         # quoted: YAML reads a bare off as false
      repository: ./models     # Path flags are relative to the config file's folder
      access_log: "-"
      no_pin: true             # a switch: true = given

The section's schema is the serve parser itself: each key is an option's ``dest`` (the flag
without ``--``, ``-`` as ``_``), and its value is checked as argparse checks the flag (the option's
``type``, ``choices``, ``nargs``), so a flag added to ``serve.add_arguments`` is accepted here with
no more code. ``--config`` and ``--help`` are not keys. The flags a platform sets per deployment
(``ENV_FLAGS``: where to listen, what to serve, logs, shutdown times) can also come from the
environment as ``LUMENRT_<DEST>`` (``LUMENRT_HTTP_PORT=8080``, ``LUMENRT_MODEL_DIR=/mnt/models``),
their text read as the command line would read it. Only those: other ``LUMENRT_`` variables mean
other things (``LUMENRT_API_KEYS`` holds the keys themselves, not ``--api-keys``' file). Precedence: the command line, then the environment, then the ``server`` section,
then the flag's default; engine flags in ``server`` (``workers``) override
the ``engine`` section's keys (``thread_count``) as the flags do.

How the command line is told apart from defaults: ``defer_defaults`` (the last call of
``add_arguments``) moves every default out of the parser (``argparse.SUPPRESS``), so a parsed
namespace holds only the flags that were given; ``apply_server_section`` fills in the rest.
"""

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from lumenrt.engine.config import ConfigError, check_keys, read_config_file
from lumenrt.engine.server_config import SECTIONS

SECTION = "server"
ENV_PREFIX = "LUMENRT_"  # LUMENRT_<DEST>: one of ENV_FLAGS from the environment
ENV_FLAGS = (
    "host",
    "http_port",
    "grpc_port",
    "tcp_port",
    "metrics_port",
    "repository",
    "model_dir",
    "model_name",
    "models",
    "log_level",
    "log_format",
    "grace_s",
    "drain_delay_s",
)
FLAGS_ATTR = "serve_flags"  # the namespace attribute that carries the ServeFlags
NOT_KEYS = ("help", "config")  # options that cannot come from the file


@dataclass(frozen=True, slots=True)
class Flag:
    action: argparse.Action
    default: Any


@dataclass(frozen=True, slots=True)
class ServeFlags:
    """The serve parser's options by dest, with their defaults (taken out of the parser)."""

    flags: Mapping[str, Flag]


def defer_defaults(parser: argparse.ArgumentParser) -> None:
    """Call after the last ``add_argument``: take every option's default out of ``parser`` (see the
    module's docstring); ``apply_server_section`` needs the namespace this parser makes."""
    flags: dict[str, Flag] = {}
    for action in parser._actions:
        if action.dest in NOT_KEYS or action.default is argparse.SUPPRESS or not action.option_strings:
            continue
        flags[action.dest] = Flag(action, action.default)
        action.default = argparse.SUPPRESS
    parser.set_defaults(**{FLAGS_ATTR: ServeFlags(flags)})


def apply_server_section(args: argparse.Namespace) -> dict[str, str]:
    """Give every option not on the command line its value from ``args.config``'s ``server``
    section, else its default. Returns dest -> where its value came from (``command line``, the
    file, ``default``). Raises ConfigError naming the field (``server.http_port``)."""
    serve_flags: ServeFlags | None = getattr(args, FLAGS_ATTR, None)
    if serve_flags is None:  # a namespace made without defer_defaults: nothing deferred
        return {}
    path: Path | None = getattr(args, "config", None)
    section: Mapping[str, Any] = {}
    if path is not None:
        raw = check_keys(read_config_file(path), SECTIONS, path, "")
        section = check_keys(raw.get(SECTION) or {}, serve_flags.flags.keys(), path, SECTION)
    origin: dict[str, str] = {}
    for dest, flag in serve_flags.flags.items():
        var = ENV_PREFIX + dest.upper()
        if hasattr(args, dest):
            origin[dest] = "command line"
        elif dest in ENV_FLAGS and var in os.environ:
            setattr(args, dest, env_value(flag, os.environ[var], var))
            origin[dest] = f"${var}"
        elif dest in section:
            assert path is not None
            setattr(args, dest, flag_value(flag, section[dest], path, f"{SECTION}.{dest}"))
            origin[dest] = str(path)
        else:
            setattr(args, dest, flag.default)
            origin[dest] = "default"
    return origin


def env_value(flag: Flag, text: str, var: str) -> Any:
    """An environment variable's text as the flag would read it on the command line (a switch:
    true/false, 1/0, yes/no; a list: words separated by spaces). ConfigError names the variable."""
    action = flag.action
    if action.nargs == 0:
        words = {
            "1": True,
            "true": True,
            "yes": True,
            "on": True,
            "0": False,
            "false": False,
            "no": False,
            "off": False,
        }
        if text.strip().lower() not in words:
            raise ConfigError(var, "", f"must be true or false (1/0, yes/no), got {text!r}")
        return action.const if words[text.strip().lower()] else flag.default
    many = action.nargs in ("+", "*")
    one = argparse.ArgumentParser(prog=var, add_help=False, exit_on_error=False)
    one.add_argument(
        "value", type=action.type or str, choices=action.choices, nargs=action.nargs if many else None
    )
    try:
        value = one.parse_args(text.split() if many else ["--", text]).value
    except (argparse.ArgumentError, SystemExit) as exc:
        raise ConfigError(var, "", str(exc) or f"cannot read {text!r}") from None
    return value


def flag_value(flag: Flag, value: Any, source: Path, field: str) -> Any:
    """A config value as the flag would have given it, checked as argparse checks the flag."""
    action = flag.action
    if action.nargs == 0:  # a switch (store_true, store_false, store_const)
        if not isinstance(value, bool):
            raise ConfigError(source, field, f"must be true or false, got {_show(value)}")
        return action.const if value else flag.default
    if action.nargs in ("+", "*") or isinstance(action.nargs, int):
        if not isinstance(value, list) or (action.nargs == "+" and not value):
            raise ConfigError(source, field, f"must be a list, got {_show(value)}")
        return [_one_value(action, v, source, f"{field}[{i}]") for i, v in enumerate(value)]
    return _one_value(action, value, source, field)


def _one_value(action: argparse.Action, value: Any, source: Path, field: str) -> Any:
    kind = action.type
    if value is None or isinstance(value, (bool, list, dict)):
        hint = ""
        if isinstance(value, bool):
            hint = " (YAML reads a bare on/off/yes/no as true/false: quote it)"
        raise ConfigError(source, field, f"must be {_expected(action)}, got {_show(value)}{hint}")
    if kind is None:
        if not isinstance(value, str):
            raise ConfigError(source, field, f"must be a string, got {_show(value)}")
        out: Any = value
    elif kind is int:
        if not isinstance(value, int):
            raise ConfigError(source, field, f"must be an integer, got {_show(value)}")
        out = value
    elif kind is float:
        if not isinstance(value, (int, float)):
            raise ConfigError(source, field, f"must be a number, got {_show(value)}")
        out = float(value)
    elif isinstance(kind, type) and issubclass(kind, PurePath):
        if not isinstance(value, str) or not value:
            raise ConfigError(source, field, f"must be a path, got {_show(value)}")
        out = kind(value)
        if not out.is_absolute():  # relative to the config file, wherever the server starts
            out = kind(source.parent / out)
    else:  # the flag's own converter (ports, byte sizes): the text it would get on the command line
        if not isinstance(value, (str, int, float)):
            raise ConfigError(source, field, f"must be {_expected(action)}, got {_show(value)}")
        convert: Any = kind
        try:
            out = convert(str(value))
        except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
            raise ConfigError(source, field, str(exc)) from None
    if action.choices is not None and out not in action.choices:
        choices = ", ".join(str(c) for c in action.choices)
        raise ConfigError(source, field, f"must be one of {choices}; got {_show(value)}")
    return out


def _expected(action: argparse.Action) -> str:
    if action.choices is not None:
        return "one of " + ", ".join(str(c) for c in action.choices)
    return {int: "an integer", float: "a number", None: "a string"}.get(action.type, "a value")  # type: ignore[arg-type]


def _show(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"
