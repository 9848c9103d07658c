"""benchmarks/cpu_idle.py's block figures and ratios (no server, no sysfs writes)."""

import pytest

from tests.benchmark_modules import import_benchmark_module

cpu_idle = import_benchmark_module("cpu_idle")


def test_a_block_counts_the_round_trips_over_one_and_a_half_times_its_p50() -> None:
    latencies = [100_000] * 97 + [149_000, 151_000, 400_000]  # ns; p50 100 µs
    got = cpu_idle.block(lambda n: latencies[:n], 100)
    assert got["p50_us"] == pytest.approx(100.0)
    assert got["over_1.5x_p50"] == 0.02  # 151 and 400 µs; 149 is not over 150
    assert got["timer_irq_per_s"] >= 0


def test_ratios_name_the_lines_and_every_rows_spread() -> None:
    def row(p50: float, p99: float) -> dict[str, float]:
        return {"p50_us": p50, "p99_us": p99}

    rtt = {
        "echo floor": row(20, 30),
        "HTTP echo floor": row(60, 90),
        "lumenrt TCP": row(50, 100),
        "lumenrt HTTP binary": row(120, 150),
        "FastAPI inline (1 worker)": row(200, 300),
    }
    got = cpu_idle.ratios(rtt)
    assert got["tcp_p50_over_fastapi"] == 0.25 and got["tcp_p50_over_echo"] == 2.5
    assert got["http_p50_over_fastapi"] == 0.6
    assert got["http_over_floor_over_fastapi_over_floor"] == round(60 / 140, 3)
    assert got["lumenrt TCP p99/p50"] == 2.0 and got["echo floor p99/p50"] == 1.5
    assert "spin tcp_p50_over_fastapi" not in got
