"""Reading ``/metrics`` as Prometheus does, without Prometheus: parse a scrape, keep scrapes over time, and
compute what a dashboard's PromQL computes from them -- ``rate`` of a counter, ``histogram_quantile`` of a
histogram's buckets. The course draws Grafana's panels from this (chapter 12), and the tests check that the
served numbers agree with the engine's own.

    s = Scrape.get("http://127.0.0.1:8000/metrics")
    s.value("vllm:generation_tokens_total")               # summed over label sets, like sum(...) in PromQL
    s.value("vllm:request_success_total", finished_reason="length")
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families


@dataclass(slots=True)
class Scrape:
    """One scrape: every sample (``name{labels} value``) and the type of each metric family."""

    time: float  # when it was taken (seconds, any clock: only differences matter)
    samples: list[tuple[str, dict[str, str], float]]
    types: dict[str, str] = field(default_factory=dict)  # family name → counter, gauge, histogram ...

    @classmethod
    def parse(cls, text: str, at: float | None = None) -> Scrape:
        samples, types = [], {}
        for family in text_string_to_metric_families(text):
            types[family.name] = family.type
            samples += [(s.name, dict(s.labels), float(s.value)) for s in family.samples]
        return cls(time.monotonic() if at is None else at, samples, types)

    @classmethod
    def get(cls, url: str, timeout: float = 10.0) -> Scrape:
        import httpx

        return cls.parse(httpx.get(url, timeout=timeout).text)

    @property
    def names(self) -> set[str]:
        """Every sample name served: ``vllm:prompt_tokens_total``, ``..._bucket``, ``..._sum``, ``..._count`` ..."""
        return {name for name, _, _ in self.samples}

    def labels(self, name: str) -> set[str]:
        """The label names the samples of ``name`` carry."""
        return {k for n, labels, _ in self.samples if n == name for k in labels}

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples of ``name`` whose labels match ``labels`` (0 if there are none)."""
        return sum(v for n, ls, v in self.samples if n == name and all(ls.get(k) == x for k, x in labels.items()))

    def buckets(self, name: str, **labels: str) -> list[tuple[float, float]]:
        """A histogram's cumulative buckets ``[(le, count), ...]``, +Inf last, summed over label sets."""
        counts: dict[float, float] = {}
        for n, ls, v in self.samples:
            if n == f"{name}_bucket" and all(ls.get(k) == x for k, x in labels.items() if k != "le"):
                le = float(ls["le"])
                counts[le] = counts.get(le, 0.0) + v
        return sorted(counts.items())


class Watch:
    """Scrapes ``url`` every ``every`` seconds in a background thread, as Prometheus would, until stopped::

        with Watch(server_url + "/metrics") as watch:
            ...  # a load
        over_time(watch.scrapes, lambda a, b: rate(a, b, "vllm:generation_tokens_total"), window=1.0)
    """

    def __init__(self, url: str, every: float = 0.25) -> None:
        self.url, self.every = url, every
        self.scrapes: list[Scrape] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="minfer-scrape", daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=10) as client:
            while True:
                self.scrapes.append(Scrape.parse(client.get(self.url).text))
                if self._stop.wait(self.every):
                    self.scrapes.append(Scrape.parse(client.get(self.url).text))  # the state at the end
                    return

    def start(self) -> Watch:
        self._thread.start()
        return self

    def stop(self) -> list[Scrape]:
        self._stop.set()
        self._thread.join()
        return self.scrapes

    def __enter__(self) -> Watch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def over_time(scrapes: Sequence[Scrape], value: Callable[[Scrape, Scrape], float],
              window: float) -> tuple[list[float], list[float]]:
    """A panel's line: at each scrape, ``value(earlier, this)`` with ``earlier`` the first scrape within ``window``
    seconds before it (PromQL's range ``[window]``). Times in seconds since the first scrape."""
    if not scrapes:
        return [], []
    t0, times, values = scrapes[0].time, [], []
    for i, b in enumerate(scrapes[1:], 1):
        # the earliest scrape inside the window, or the one just before this one if the window holds none
        a = next((s for s in scrapes[:i] if s.time >= b.time - window), scrapes[i - 1])
        times.append(b.time - t0)
        values.append(value(a, b))
    return times, values


def rate(a: Scrape, b: Scrape, name: str, **labels: str) -> float:
    """Per second between two scrapes, as PromQL's ``rate`` (without its extrapolation to the window's edges)."""
    dt = b.time - a.time
    return (b.value(name, **labels) - a.value(name, **labels)) / dt if dt > 0 else math.nan


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """PromQL's ``histogram_quantile`` over cumulative ``(le, count)`` buckets (+Inf last): find the bucket the
    q-th observation falls in and interpolate linearly inside it (the first bucket starts at 0; a quantile in the
    +Inf bucket is the highest finite bound). NaN without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return lower_le


def bucket_increase(a: Scrape, b: Scrape, name: str, **labels: str) -> list[tuple[float, float]]:
    """The buckets' growth between two scrapes: what ``histogram_quantile(q, rate(name_bucket[...]))`` reads."""
    before = dict(a.buckets(name, **labels))
    return [(le, count - before.get(le, 0.0)) for le, count in b.buckets(name, **labels)]


# ---- PromQL, just enough to see which metrics and labels an expression reads --------------------------------
_STRING = re.compile(r'"(?:\\.|[^"\\])*"')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def promql_metrics(expr: str) -> set[str]:
    """The metric (sample) names a PromQL expression reads: every identifier that is not a function (followed
    by ``(``), a keyword, a label in a matcher ``{...}`` or a grouping ``by (...)``, a range ``[...]`` or a
    string. ``rate(vllm:e2e_request_latency_seconds_sum{model_name="$m"}[5m])`` →
    ``{"vllm:e2e_request_latency_seconds_sum"}``."""
    rest = _GROUPING.sub(" ", _RANGE.sub(" ", _MATCHERS.sub(" ", _STRING.sub('""', expr))))
    names = set()
    for m in _NAME.finditer(rest):
        if rest[m.end():].lstrip().startswith("(") or m.group() in _KEYWORDS:
            continue
        names.add(m.group())
    return names


def promql_labels(expr: str) -> set[str]:
    """The label names an expression matches on or groups by (``model_name``, ``le``, ``finished_reason``)."""
    text = _STRING.sub('""', expr)
    labels = {m.group(1) for block in _MATCHERS.findall(text) for m in re.finditer(r"(\w+)\s*[=!]~?", block)}
    labels |= {name.strip() for group in _GROUPING.findall(text) for name in group.split(",") if name.strip()}
    return labels
