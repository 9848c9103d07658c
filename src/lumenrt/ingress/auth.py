"""Who may call which endpoints: API keys, endpoint groups, and the 401/403 answers.

A key file (YAML or JSON; or the same document in the ``LUMENRT_API_KEYS`` environment variable,
never a command-line argument, where ``ps`` would show it)::

    keys:
      - name: app                # shown in logs, metrics and errors; the key never is
        key: "k3y-0f-the-app"    # the secret itself ...
        groups: [inference, metadata]
      - name: ops
        sha256: "9f86d0..."      # ... or its SHA-256 in hex, so the file holds no secret
        groups: ["*"]            # every group

Endpoint groups (as Triton's ``--http-restricted-api``): ``inference``, ``health``, ``metadata``,
``model-repository``, ``statistics``, ``metrics``, ``shared-memory``. With keys configured, a
group is open (no key needed) only if it is in ``open_groups`` (default: health, so probes keep
working); every other group answers 401 without a key and 403 for a key outside the group.
Without keys every group is open.

Where a client puts its key: HTTP ``Authorization: Bearer <key>`` or the header named by
``key_header`` (default ``x-api-key``: Triton's restricted-API form, ``<header>: <value>``, for
tritonclient users); gRPC the same two as metadata; the TCP protocol an AUTH frame
(docs/tcp-protocol.md).

Invariants
  1. A presented key is hashed (SHA-256) and looked up by digest; the final match is
     ``hmac.compare_digest``. What a lookup's timing can reveal is a digest's prefix, never the key.
  2. A key's text is never stored (only its digest), logged, put in a metric or echoed in an
     error; errors and logs name the key's ``name``.
  3. ``KeySet`` is immutable. ``Gate.reload`` swaps in a new one whole (an attribute store, atomic
     under the GIL) and bumps ``generation``; a connection that cached a key re-resolves it when
     the generation moved, so a removed key stops working on open connections too.
  4. A bad file at reload keeps the keys in use and says why (a server never opens up on a typo).
"""

import hashlib
import hmac
import json
import logging
import os
import stat
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lumenrt.protocols.errors import ServerError
from lumenrt.protocols.http_headers import HttpError

logger = logging.getLogger(__name__)

GROUPS = (
    "inference",
    "health",
    "metadata",
    "model-repository",
    "statistics",
    "metrics",
    "shared-memory",
)
ALL_GROUPS = "*"
DEFAULT_OPEN_GROUPS = ("health",)
KEYS_ENV = "LUMENRT_API_KEYS"  # the key document itself (JSON or YAML), as an alternative to a file
DEFAULT_KEY_HEADER = "x-api-key"
MAX_KEY_BYTES = 4096  # a presented key longer than this is refused before it is hashed
MIN_KEY_CHARS = 16  # a configured key shorter than this is refused (guessable)
_BEARER = b"bearer "


class KeyFileError(ValueError):
    """A key document that cannot be used; the message names where and which field, never a key."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    digest: bytes  # SHA-256 of the key
    groups: frozenset[str]

    def may(self, group: str) -> bool:
        return group in self.groups


def key_digest(key: bytes | str) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


@dataclass(frozen=True, slots=True)
class KeySet:
    by_digest: Mapping[bytes, ApiKey]
    plaintext: bool = False  # some key is given as itself, not as its digest

    def find(self, presented: bytes) -> ApiKey | None:
        """The key ``presented`` is, or None (invariant 1)."""
        if not presented or len(presented) > MAX_KEY_BYTES:
            return None
        digest = key_digest(presented)
        key = self.by_digest.get(digest)
        if key is not None and hmac.compare_digest(key.digest, digest):
            return key
        return None

    def names(self) -> list[str]:
        return sorted(k.name for k in self.by_digest.values())


def parse_keys(doc: Any, source: str) -> KeySet:
    """The key set of a parsed key document; KeyFileError names the field (never a key's value)."""
    if not isinstance(doc, Mapping) or set(doc) - {"keys"}:
        raise KeyFileError(f"{source}: must be a mapping with one entry, 'keys' (a list)")
    entries = doc.get("keys")
    if not isinstance(entries, list) or not entries:
        raise KeyFileError(f"{source}: keys: must be a non-empty list of {{name, key | sha256, groups}}")
    by_digest: dict[bytes, ApiKey] = {}
    names: set[str] = set()
    plaintext = False
    for i, entry in enumerate(entries):
        where = f"{source}: keys[{i}]"
        if not isinstance(entry, Mapping):
            raise KeyFileError(f"{where}: must be a mapping with name, key (or sha256) and groups")
        unknown = set(entry) - {"name", "key", "sha256", "groups"}
        if unknown:
            raise KeyFileError(
                f"{where}: unknown field(s) {sorted(map(str, unknown))} (valid: name, key, sha256, groups)"
            )
        name = entry.get("name")
        if not isinstance(name, str) or not name or len(name) > 64 or not name.isprintable():
            raise KeyFileError(f"{where}.name: must be a printable string of 1..64 characters")
        if name in names:
            raise KeyFileError(f"{where}.name: {name!r} is given twice")
        names.add(name)
        digest = _entry_digest(entry, f"{where} ({name!r})")
        plaintext = plaintext or "key" in entry
        if digest in by_digest:
            raise KeyFileError(f"{where} ({name!r}): the same key as {by_digest[digest].name!r}")
        by_digest[digest] = ApiKey(name, digest, _groups(entry.get("groups"), f"{where}.groups"))
    return KeySet(by_digest, plaintext)


def _entry_digest(entry: Mapping[str, Any], where: str) -> bytes:
    key, hexed = entry.get("key"), entry.get("sha256")
    if (key is None) == (hexed is None):
        raise KeyFileError(f"{where}: give exactly one of key and sha256")
    if key is not None:
        if not isinstance(key, str) or len(key) < MIN_KEY_CHARS or len(key.encode()) > MAX_KEY_BYTES:
            raise KeyFileError(
                f"{where}.key: must be a string of {MIN_KEY_CHARS} to {MAX_KEY_BYTES} bytes "
                "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        if key != key.strip():
            raise KeyFileError(f"{where}.key: has leading or trailing white space")
        return key_digest(key)
    try:
        digest = bytes.fromhex(hexed) if isinstance(hexed, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise KeyFileError(f"{where}.sha256: must be 64 hex digits (the key's SHA-256)")
    return digest


def _groups(raw: Any, where: str) -> frozenset[str]:
    if raw == ALL_GROUPS or raw == [ALL_GROUPS]:
        return frozenset(GROUPS)
    if not isinstance(raw, list) or not raw or not all(isinstance(g, str) for g in raw):
        raise KeyFileError(
            f"{where}: must be a non-empty list of group names or ['*'] (groups: {', '.join(GROUPS)})"
        )
    return frozenset(check_groups(raw, where))


def check_groups(names: Iterable[str], where: str) -> list[str]:
    out = []
    for name in names:
        if name not in GROUPS:
            raise KeyFileError(f"{where}: unknown endpoint group {name!r} (groups: {', '.join(GROUPS)})")
        out.append(name)
    return out


def _read_doc(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        pass
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise KeyFileError(f"{source}: not valid YAML or JSON{at}") from None  # no excerpt: it holds keys


@dataclass(frozen=True, slots=True)
class KeySource:
    """Where the keys come from: a file (reloadable) or the environment (read once)."""

    path: Path | None = None
    env_text: str | None = None

    @property
    def label(self) -> str:
        return str(self.path) if self.path is not None else f"${KEYS_ENV}"

    def load(self) -> KeySet:
        if self.path is not None:
            try:
                text = self.path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise KeyFileError(
                    f"{self.path}: cannot read: {exc.__class__.__name__}: {exc.args[-1]}"
                ) from None
            return parse_keys(_read_doc(text, self.label), self.label)
        assert self.env_text is not None
        return parse_keys(_read_doc(self.env_text, self.label), self.label)

    def stamp(self) -> tuple[int, int, int] | None:
        """What tells a changed file from the loaded one (cheap: one stat)."""
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def readable_by_others(self) -> bool:
        try:
            return self.path is not None and bool(self.path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH))
        except OSError:
            return False


def key_source(path: Path | None) -> KeySource | None:
    """The keys' source from ``--api-keys`` or the environment; None when neither is given."""
    env = os.environ.get(KEYS_ENV)
    if path is not None and env:
        raise KeyFileError(f"--api-keys and ${KEYS_ENV} are both given: use one")
    if path is not None:
        return KeySource(path=path)
    if env:
        return KeySource(env_text=env)
    return None


class Gate:
    """The key check every front end makes before it serves a request of a restricted group."""

    def __init__(
        self,
        source: KeySource,
        open_groups: Collection[str] = DEFAULT_OPEN_GROUPS,
        key_header: str = DEFAULT_KEY_HEADER,
    ) -> None:
        self.source = source
        self.open_groups = frozenset(check_groups(open_groups, "--open-groups"))
        self.key_header = key_header.lower().encode("latin-1")
        self.grpc_key_header = key_header.lower()
        self._stamp = source.stamp()
        self.keys = source.load()  # raises KeyFileError: the server does not start
        if self.keys.plaintext and source.readable_by_others():
            logger.warning(
                "%s holds keys and other users can read it: chmod 600 it, or give each key's sha256",
                source.label,
            )
        self.generation = 0
        self.refused = {"unauthenticated": 0, "forbidden": 0}  # for the metrics

    # ---- reload -------------------------------------------------------------------------------

    def changed(self) -> bool:
        return self.source.path is not None and self.source.stamp() != self._stamp

    def reload(self) -> bool:
        """Read the keys again; True if they were replaced. A bad file keeps the old keys (logged)."""
        stamp = self.source.stamp()
        try:
            keys = self.source.load()
        except KeyFileError as exc:
            self._stamp = stamp  # do not retry the same bad file every watch tick
            logger.error("API keys not reloaded, the old ones stay in use: %s", exc)
            return False
        self._stamp = stamp
        self.keys = keys
        self.generation += 1
        logger.info("API keys reloaded from %s: %s", self.source.label, ", ".join(keys.names()))
        return True

    # ---- checks -------------------------------------------------------------------------------

    def is_open(self, group: str) -> bool:
        return group in self.open_groups

    def check(self, group: str, key: ApiKey | None, presented: bool) -> ApiKey | None:
        """``key`` (found from what the client presented) if it may use ``group``; raises 401 or 403."""
        if group in self.open_groups:
            return key
        if key is None:
            self.refused["unauthenticated"] += 1
            if presented:
                raise unauthorized(f"the API key is not valid (the '{group}' endpoints need one)")
            raise unauthorized(
                f"the '{group}' endpoints need an API key: send 'Authorization: Bearer <key>' "
                f"(or the '{self.grpc_key_header}' header)"
            )
        if group not in key.groups:
            self.refused["forbidden"] += 1
            raise ServerError(403, f"API key {key.name!r} may not use the '{group}' endpoints")
        return key

    def from_headers(self, headers: Mapping[bytes, bytes]) -> tuple[ApiKey | None, bool]:
        """The key an HTTP request presents, and whether it presented one at all."""
        presented = bearer(headers.get(b"authorization"))
        if presented is None:
            presented = headers.get(self.key_header)
        if presented is None:
            return None, False
        return self.keys.find(presented.strip()), True

    def from_metadata(self, metadata: Iterable[tuple[str, Any]] | None) -> tuple[ApiKey | None, bool]:
        """The key a gRPC call presents (its invocation metadata)."""
        presented: bytes | None = None
        for name, value in metadata or ():
            if name == "authorization":
                raw = value.encode("latin-1") if isinstance(value, str) else bytes(value)
                presented = bearer(raw)
            elif name == self.grpc_key_header and presented is None:
                presented = value.encode("latin-1") if isinstance(value, str) else bytes(value)
            if presented is not None:
                break
        if presented is None:
            return None, False
        return self.keys.find(presented.strip()), True


def bearer(value: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` value (None for other schemes)."""
    if value is None or len(value) < len(_BEARER) or value[: len(_BEARER)].lower() != _BEARER:
        return None
    return value[len(_BEARER) :]


def unauthorized(message: str) -> ServerError:
    return HttpError(401, message, [(b"www-authenticate", b'Bearer realm="lumenrt"')])
