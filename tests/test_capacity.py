"""The capacity report (minfer.capacity): the same requests at each rate, the capacity read below the first miss,
and the sweep on the simulator, where it is deterministic."""

from __future__ import annotations

import json
import math

import pytest

from minfer.capacity import CapacityReport, RatePoint, capacity_figure, capacity_sweep, sweep_workload
from minfer.metrics import SLO, Latency, Summary

SLO_1S = SLO(ttft=1.0)


def point(rate: float, met: float) -> RatePoint:
    return RatePoint(rate, rate, 10 * rate, 0.1, 0.2, 0.01, 0.02, rate * met, met)


def test_capacity_is_the_highest_rate_below_the_first_miss():
    def capacity(*met):
        return CapacityReport("s", SLO_1S, 0.9, tuple(point(2.0 ** i, m) for i, m in enumerate(met))).capacity

    assert capacity(1.0, 0.95, 0.9, 0.5) == 4.0  # 0.9 is the target: met
    assert capacity(1.0, 0.5, 1.0) == 1.0  # a pass above a miss is noise, not capacity
    assert capacity(0.89, 1.0) is None  # even the lowest rate misses
    assert capacity(1.0, 1.0) == 2.0


def fake_summary(attainment: float) -> Summary:
    lat = Latency(0.1, 0.1, 0.2, 0.2, 0.05, 4)
    return Summary(4, {"length": 4}, 1.0, 40, 40, 40.0, 4.0, lat, lat, lat, lat, lat, 0, 0, 0.0, SLO_1S,
                   4.0 * attainment, 40.0 * attainment, attainment)


def test_each_rate_sends_the_same_requests_faster_and_the_sweep_stops_past_saturation():
    workload = sweep_workload(6, seed=3)
    seen = []

    def run(items):
        seen.append(items)
        return fake_summary(1.0 if len(seen) <= 2 else 0.0)  # the third rate on misses

    report = capacity_sweep(run, workload, SLO_1S, rates=[8, 1, 2, 4, 16, 32], stop_after_misses=2)
    assert [p.rate for p in report.points] == [1, 2, 4, 8]  # rising; two misses in a row end it
    assert report.capacity == 2
    for rate, items in zip([1, 2, 4, 8], seen):
        assert [(w.prompt_len, w.output_len) for w in items] == [(w.prompt_len, w.output_len) for w in workload]
        assert [w.arrival_time for w in items] == pytest.approx([w.arrival_time / rate for w in workload])
    with pytest.raises(ValueError, match="rates"):
        capacity_sweep(run, workload, SLO_1S, rates=[0, 1])
    with pytest.raises(ValueError, match="goodput"):
        RatePoint.of(1.0, Summary(1, {}, 1.0, 1, 1, 1.0, 1.0, *[Latency(0, 0, 0, 0, 0, 0)] * 5, 0, 0, 0.0))


def test_the_simulated_gpu_saturates_and_the_report_repeats(tmp_path):
    from minfer.bench import main

    args = ["--sweep", "--sim", "H100-SXM", "--model", "llama-3-8b", "-n", "120", "--rates", "4,256",
            "--slo-ttft", "0.5", "--json", str(tmp_path / "a.json")]
    main(args)
    main(args[:-1] + [str(tmp_path / "b.json")])
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("a.json", "b.json"))
    assert a["reports"] == b["reports"]  # the simulator is deterministic
    low, high = a["reports"][0]["points"]
    assert low["slo_attainment"] == 1.0 and high["slo_attainment"] < 0.9  # 4/s is easy, 256/s queues
    assert high["ttft_p99"] > 10 * low["ttft_p99"] and a["reports"][0]["capacity"] == 4.0
    assert math.isclose(low["goodput"], low["request_throughput"])


def test_the_figure_draws_goodput_and_ttft_per_system():
    report = CapacityReport("s", SLO_1S, 0.9, (point(1, 1.0), point(2, 1.0), point(4, 0.3)))
    fig = capacity_figure([report])
    goodput, ttft = fig.data
    assert list(goodput.x) == [1, 2, 4] and list(goodput.y) == [1.0, 2.0, 1.2]
    assert list(ttft.y) == [0.2, 0.2, 0.2]
    assert any("2/s" in (a.text or "") for a in fig.layout.annotations)  # the capacity marked
