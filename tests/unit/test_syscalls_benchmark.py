"""benchmarks/syscalls.py's reading of ``strace -c`` output (no server, no strace)."""

from tests.benchmark_modules import import_benchmark_module

syscalls = import_benchmark_module("syscalls")

SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 94.52    0.963605       26766        36        30 futex
  3.24    0.033027           8      4002           write
  1.20    0.012229           3      4016           epoll_pwait
  0.99    0.010092           2      4003           read
  0.00    0.000008           0         9           getpid
------ ----------- ----------- --------- --------- ----------------
100.00    1.018961          63     12066        30 total
"""


def test_calls_are_read_per_system_call_with_or_without_errors_and_without_the_total() -> None:
    assert syscalls.parse_strace_summary(SUMMARY) == {
        "futex": 36,
        "write": 4002,
        "epoll_pwait": 4016,
        "read": 4003,
        "getpid": 9,
    }


def test_output_without_a_table_reads_as_no_calls() -> None:
    assert syscalls.parse_strace_summary("strace: Process 12 attached\n") == {}
