"""placement/cpu_idle.py: reading how idle CPUs sleep from a fake sysfs tree, and the note the
server prints when a guest halts without polling."""

from pathlib import Path

from lumenrt.placement.cpu_idle import CpuIdle, describe_idle, halts_at_once, read_cpu_idle


def _tree(root: Path, driver: str, poll_ns: str | None, states: dict[int, tuple[str, str]]) -> Path:
    cpuidle = root / "sys/devices/system/cpu/cpuidle"
    cpuidle.mkdir(parents=True)
    (cpuidle / "current_driver").write_text(f"{driver}\n")
    (cpuidle / "current_governor_ro").write_text("haltpoll\n")
    if poll_ns is not None:
        params = root / "sys/module/haltpoll/parameters"
        params.mkdir(parents=True)
        (params / "guest_halt_poll_ns").write_text(f"{poll_ns}\n")
    for index, (name, disabled) in states.items():
        state = root / f"sys/devices/system/cpu/cpu0/cpuidle/state{index}"
        state.mkdir(parents=True)
        (state / "name").write_text(f"{name}\n")
        (state / "disable").write_text(f"{disabled}\n")
    return root


def test_a_guest_that_halts_at_once_is_read_and_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, "haltpoll", "0", {1: ("haltpoll", "0"), 0: ("POLL", "0")})
    idle = read_cpu_idle(root)
    assert idle == CpuIdle("haltpoll", "haltpoll", 0, ("POLL", "haltpoll"))
    note = halts_at_once(idle)
    assert note is not None
    assert "guest_halt_poll_ns=0" in note
    assert "/sys/module/haltpoll/parameters/guest_halt_poll_ns" in note
    assert idle.as_dict()["states"] == ["POLL", "haltpoll"]


def test_a_guest_that_polls_first_gets_no_note(tmp_path: Path) -> None:
    idle = read_cpu_idle(_tree(tmp_path, "haltpoll", "200000", {0: ("POLL", "0")}))
    assert idle.guest_halt_poll_ns == 200000
    assert halts_at_once(idle) is None


def test_disabled_states_and_other_drivers(tmp_path: Path) -> None:
    root = _tree(tmp_path, "intel_idle", None, {0: ("POLL", "1"), 1: ("C1", "0"), 10: ("C6", "0")})
    idle = read_cpu_idle(root)
    assert idle.states == ("C1", "C6")  # by number, not by name; the disabled one left out
    assert idle.guest_halt_poll_ns is None
    assert halts_at_once(idle) is None


def test_no_sysfs_reads_as_unknown(tmp_path: Path) -> None:
    idle = read_cpu_idle(tmp_path)
    assert idle == CpuIdle(None, None, None, ())
    assert halts_at_once(idle) is None


def test_the_topology_line_says_what_was_read() -> None:
    halting = CpuIdle("haltpoll", "haltpoll", 0, ("POLL", "haltpoll"))
    assert describe_idle(halting) == (
        "idle CPUs: driver haltpoll, governor haltpoll, guest_halt_poll_ns 0 (halt at once: README, CPU "
        "idle on a virtual machine); CPU 0's states: POLL, haltpoll"
    )
    assert describe_idle(CpuIdle("intel_idle", "menu", None, ("C1", "C6"))) == (
        "idle CPUs: driver intel_idle, governor menu; CPU 0's states: C1, C6"
    )
    assert describe_idle(CpuIdle(None, None, None, ())).startswith("idle CPUs: not reported")
