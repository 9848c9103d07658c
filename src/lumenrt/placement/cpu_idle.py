"""How this machine's idle CPUs sleep, read from sysfs: what a request that wakes one pays.

At one client, every request finds the server idle: the client's write wakes the event loop, and
the answer wakes the client. On a virtual machine an idle vCPU halts (a VM exit), and the
hypervisor may run something else on its core; the wake-up is an interrupt the host delivers,
and the code that runs next finds its caches and branch predictors cold. The guest's
``cpuidle-haltpoll`` driver exists for this: it polls for up to ``guest_halt_poll_ns`` (the
kernel's default 200000) before it halts, adapting per CPU. A guest image that sets it to 0 halts
at once. Measured on the 2-CPU VM, digits_mlp at one client (benchmarks/latency.py, README "CPU
idle on a virtual machine"), that setting alone moves the echo floor and every server's round
trip, lumenrt's and FastAPI's alike.

What is read, below ``root`` (``/`` on a real machine; a fake tree in the tests):
  - ``sys/devices/system/cpu/cpuidle/current_driver``: ``haltpoll``, ``intel_idle``,
    ``acpi_idle``, ``none``, ...
  - ``.../cpuidle/current_governor_ro`` (or ``current_governor``, when it can be changed);
  - ``sys/module/haltpoll/parameters/guest_halt_poll_ns`` (the haltpoll governor's);
  - ``sys/devices/system/cpu/cpu0/cpuidle/state*/{name,disable}``: the idle states CPU 0 may enter.

A file that is missing or unreadable reads as None: a container may hide sysfs, and a machine
with no cpuidle driver has none of these files.
"""

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

_CPUIDLE = "sys/devices/system/cpu/cpuidle"
_HALT_POLL_NS = "sys/module/haltpoll/parameters/guest_halt_poll_ns"
_CPU0_STATES = "sys/devices/system/cpu/cpu0/cpuidle"
KERNEL_HALT_POLL_NS = 200_000  # Documentation/virt/guest-halt-polling.rst: the module's default


@dataclass(frozen=True, slots=True)
class CpuIdle:
    driver: str | None
    governor: str | None
    guest_halt_poll_ns: int | None  # haltpoll only
    states: tuple[str, ...]  # CPU 0's idle states that are not disabled, shallowest first

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "states": list(self.states)}


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_cpu_idle(root: Path | str = "/") -> CpuIdle:
    base = Path(root)
    cpuidle = base / _CPUIDLE
    governor = _text(cpuidle / "current_governor_ro") or _text(cpuidle / "current_governor")
    poll = _text(base / _HALT_POLL_NS)
    states: list[tuple[int, str]] = []
    state_dirs = base / _CPU0_STATES
    if state_dirs.is_dir():
        for entry in state_dirs.glob("state*"):
            index, name = entry.name[len("state") :], _text(entry / "name")
            if not index.isdigit() or name is None or _text(entry / "disable") == "1":
                continue
            states.append((int(index), name))
    return CpuIdle(
        driver=_text(cpuidle / "current_driver"),
        governor=governor,
        guest_halt_poll_ns=int(poll) if poll is not None and poll.isdigit() else None,
        states=tuple(name for _, name in sorted(states)),
    )


def describe_idle(idle: CpuIdle) -> str:
    """One line for ``lumenrt topology``."""
    if idle.driver is None:
        return "idle CPUs: not reported (no cpuidle driver in sysfs)"
    line = f"idle CPUs: driver {idle.driver}, governor {idle.governor or '-'}"
    if idle.guest_halt_poll_ns is not None:
        line += f", guest_halt_poll_ns {idle.guest_halt_poll_ns}"
        if halts_at_once(idle):
            line += " (halt at once: README, CPU idle on a virtual machine)"
    return line + f"; CPU 0's states: {', '.join(idle.states) or '-'}"


def halts_at_once(idle: CpuIdle) -> str | None:
    """A sentence for the operator when idle vCPUs halt without polling first (haltpoll with
    ``guest_halt_poll_ns`` 0), else None."""
    if idle.driver != "haltpoll" or idle.guest_halt_poll_ns != 0:
        return None
    return (
        "idle CPUs halt at once (cpuidle-haltpoll, guest_halt_poll_ns=0): at low load every request "
        "pays a vCPU wake-up on the way in and its client one on the way out; for low latency write "
        f"{KERNEL_HALT_POLL_NS} (the kernel's default) to /{_HALT_POLL_NS}, or give --loop-spin-us "
        "(README: CPU idle on a virtual machine)"
    )
