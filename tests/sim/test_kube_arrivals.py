"""How a replay's pods arrive (sim/kube_arrivals.py): the `--arrival` modes and the trace's
inter-arrival gaps. The arrivals themselves reach a real API server in tests/e2e/test_real_replay.py."""

from __future__ import annotations

import pathlib

import pytest

from gpuslice.sim import kube_arrivals, trace


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sequential", kube_arrivals.Arrival("sequential")),
        ("burst", kube_arrivals.Arrival("burst")),
        ("compressed:3600", kube_arrivals.Arrival("compressed", 3600.0)),
    ],
)
def test_arrival_modes(text: str, expected: kube_arrivals.Arrival) -> None:
    assert kube_arrivals.parse_arrival(text) == expected
    assert str(kube_arrivals.parse_arrival(text)) == text


@pytest.mark.parametrize("text", ["", "bursty", "compressed", "compressed:0", "compressed:-2", "compressed:x"])
def test_a_bad_arrival_mode_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="arrival"):
        kube_arrivals.parse_arrival(text)


def test_trace_gaps_are_the_sorted_creation_times_differences(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "pods.csv"
    path.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time\na,1,1,0,0,30\nb,1,1,0,0,0\nc,1,1,0,0,10\n"
    )
    assert kube_arrivals.trace_gaps(path) == [10.0, 20.0]
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,0,0\n")
    with pytest.raises(trace.TraceError, match="creation_time"):
        kube_arrivals.trace_gaps(path)
