"""The open-file limit: every connection is a file descriptor, and the usual soft limit (1024)
would cap a server at about a thousand connections, so ``lumenrt serve`` raises its soft
RLIMIT_NOFILE at start as far as the hard limit allows, up to ``FD_LIMIT_CAP``; it never lowers
it. What is left after ``FD_RESERVE`` is about how many connections the server can hold; the
lifecycle line says so, with a warning when that is below ``WANTED_CONNECTIONS`` or below the
per-client connection cap (which then cannot protect the others).

A server out of descriptors still runs: a new connection is accepted and closed at once by the
event loop (libuv keeps a spare descriptor for that; seen here at a limit of 1024: the 1,006th
connection and every one after it were closed, the 1,005 open ones were answered), and connections
already open go on.
"""

import resource
from dataclasses import dataclass
from types import ModuleType

# The most raised to: a descriptor per connection; an idle connection costs the server ~2 KiB plus
# the kernel's socket (benchmarks/connections.py), and one event loop walks every connection in its
# sweeps, so beyond this many a deployment runs more replicas (guessed). A soft limit already
# above it (ulimit -n) is kept.
FD_LIMIT_CAP = 1 << 16
# Descriptors that are not connections: the listening sockets, model files, the log, the engine's
# eventfds and pipes, process-mode workers' sockets (guessed, with room to spare: lumenrt serve with
# digits_mlp in thread mode holds 19, measured).
FD_RESERVE = 256
WANTED_CONNECTIONS = 10_000  # fewer than this fit: a warning (issue 18's C10K)


@dataclass(frozen=True, slots=True)
class FdLimit:
    """The soft limit found (``before``) and the one now in force (``after``); ``hard`` is None
    when unlimited; ``error`` says why raising failed (then ``after`` is ``before``)."""

    before: int
    after: int
    hard: int | None
    error: str = ""

    @property
    def connections(self) -> int:
        """About how many connections fit under the limit now."""
        return max(self.after - FD_RESERVE, 0)


def _limit(value: int, rlimit: ModuleType) -> int | None:
    return None if value == rlimit.RLIM_INFINITY else value


def raise_fd_limit(cap: int = FD_LIMIT_CAP, rlimit: ModuleType = resource) -> FdLimit:
    """Raise the soft RLIMIT_NOFILE to min(hard, ``cap``), never lowering it. ``rlimit``: the
    ``resource`` module (tests pass a fake)."""
    soft, hard = rlimit.getrlimit(rlimit.RLIMIT_NOFILE)
    found, ceiling = _limit(soft, rlimit), _limit(hard, rlimit)
    if found is None:  # unlimited already
        return FdLimit(soft, soft, ceiling)
    target = cap if ceiling is None else min(ceiling, cap)
    if target <= found:
        return FdLimit(found, found, ceiling)
    try:
        rlimit.setrlimit(rlimit.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:  # e.g. macOS refuses more than OPEN_MAX
        return FdLimit(found, found, ceiling, f"{type(exc).__name__}: {exc}")
    return FdLimit(found, target, ceiling)


def describe(limit: FdLimit, per_client: int) -> tuple[str, str | None]:
    """The lifecycle line about ``limit``, and a warning when it is low (else None) for
    ``per_client``, the per-client connection cap (0: none)."""
    hard = "unlimited" if limit.hard is None else f"{limit.hard}"
    if limit.after > limit.before:
        what = f"open-file limit raised {limit.before} -> {limit.after} (hard {hard})"
    else:
        what = f"open-file limit {limit.after} (hard {hard})"
        if limit.error:
            what += f", could not be raised: {limit.error}"
    line = f"{what}: about {limit.connections} connections fit"
    fit = limit.connections
    fix = "raise the hard limit (ulimit -Hn; systemd LimitNOFILE=; docker run --ulimit nofile=N:N)"
    warning = None
    if fit < WANTED_CONNECTIONS:
        warning = f"only about {fit} connections fit under the open-file limit of {limit.after}: {fix}"
    if per_client and per_client >= fit:
        warning = (
            f"--max-connections-per-client {per_client} is not below the about {fit} connections that fit "
            f"under the open-file limit of {limit.after}: one client can take them all; lower it, or {fix}"
        )
    return line, warning
