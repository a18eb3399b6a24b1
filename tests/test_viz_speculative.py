"""The dashboard under speculative decoding: each decode's guesses, accepted and rejected, in the batch view.

The simulator decides each guess by a hash of (request, position) at ``acceptance_rate``
(``minfer.sim.executor.guess_is_right``), so the guesses every decode keeps are known before the run: the tests
work them out from that rule and the trace's positions, and compare the figure's bars with them -- not with the
trace fields the figure was drawn from. Without speculation, nothing about the view may change.
"""

from __future__ import annotations

import json

import pytest

from conftest import tiny_engine
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.metrics import SpecDecodeStats
from minfer.sim.executor import guess_is_right
from minfer.viz import (
    ColorMap,
    FrameOptions,
    Recorder,
    Recording,
    batch_chart,
    batch_data,
    batch_figure,
    dashboard_frame,
)
from minfer.viz.style import GUESS_LABELS, PHASE_LABELS

K, RATE = 4, 0.6
GUESS_TRACES = ("accepted", "rejected")


def simulated(speculative: bool) -> Recording:
    spec = {"method": "ngram", "num_speculative_tokens": K, "acceptance_rate": RATE} if speculative else None
    engine = LLMEngine(EngineConfig(model="llama-3.1-8b", executor="sim", hardware="H100-SXM", num_blocks=64,
                                    debug_checks=True, speculative_config=spec))
    for i in range(3):
        engine.add_request(f"r{i}", [1 + i] * 40, SamplingParams(max_tokens=16, ignore_eos=True))
    return Recorder(engine).run()


@pytest.fixture(scope="module")
def spec_run() -> Recording:
    return simulated(True)


@pytest.fixture(scope="module")
def plain_run() -> Recording:
    return simulated(False)


def kept(request: str, position: int, k: int) -> int:
    """Of ``k`` guesses after a decode at ``position``, those the simulator keeps: right ones up to the first
    wrong one."""
    a = 0
    while a < k and guess_is_right(request, position + 1 + a, RATE):
        a += 1
    return a


def by_bar(trace: dict) -> dict[tuple[int, str], tuple[int, int, str]]:
    """(step, request) → (base, height, hover) of each bar of a plotly bar trace, in request-hue order."""
    return {(x, r.split(": ")[0].split(" · ")[1]): (b, y, r)
            for x, b, y, r in zip(trace["x"], trace["base"], trace["y"], trace["hovertext"])}


def test_the_batch_view_splits_each_decode_into_verified_accepted_and_rejected(spec_run):
    rec = spec_run
    traces = {t["name"]: t for t in batch_figure(rec.trace, legend=False)["data"]}
    assert list(traces) == ["decode", "prefill", "accepted", "rejected"], "decode and prefill first, as before"
    decode, accepted, rejected = (by_bar(traces[n]) for n in ("decode", "accepted", "rejected"))
    checked = partial = 0
    for t in rec.trace:
        for rid in t.decode_tokens:
            k = t.draft_tokens.get(rid, 0)  # the lookahead the scheduler gave it (fewer near max_tokens)
            a = kept(rid, t.positions[rid], k)  # from the simulator's rule, not from the trace
            base, height, hover = decode[t.step, rid]
            assert height == 1, (t.step, rid)
            assert (f"{k} guessed, {a} accepted" in hover) == (k > 0) and ("guessed" in hover) == (k > 0), hover
            if a:
                assert accepted[t.step, rid][:2] == (base + 1, a), f"step {t.step} {rid}: {a} kept, on the token"
            else:
                assert (t.step, rid) not in accepted
            if a < k:
                assert rejected[t.step, rid][:2] == (base + 1 + a, k - a), f"step {t.step} {rid}: {k - a} thrown"
            else:
                assert (t.step, rid) not in rejected
            partial += 0 < a < k
            checked += k == K
    assert checked > 10 and partial > 3, "the run should have decodes that kept some guesses, not all"
    # a known decode: the first that kept some of K guesses, not all; its bars say so in words
    step, rid = next(key for key in decode if rec.trace[key[0]].draft_tokens.get(key[1]) == K
                     and 0 < kept(key[1], rec.trace[key[0]].positions[key[1]], K) < K)
    at = rec.trace[step].positions[rid]
    a = kept(rid, at, K)
    assert accepted[step, rid][2] == (f"step {step} · {rid}: accepted guesses, "
                                      + (f"positions {at + 1}–{at + a}" if a > 1 else f"position {at + 1}")
                                      + f" (kept) · {K} guessed, {a} accepted")
    assert rejected[step, rid][2].endswith(f"{at + K} (rolled back) · {K} guessed, {a} accepted")


def test_the_bars_add_up_to_every_token_the_pass_computed(spec_run):
    rec = spec_run
    d = batch_data(rec.trace)
    stats = SpecDecodeStats.of(rec.trace)
    assert sum(d.accepted.tokens) == stats.num_accepted_tokens
    assert sum(d.rejected.tokens) == stats.num_draft_tokens - stats.num_accepted_tokens > 0
    spans: dict[int, list[tuple[int, int]]] = {}
    for bars in (d.decode, d.prefill, d.accepted, d.rejected):
        for s, b, n in zip(bars.step, bars.base, bars.tokens):
            spans.setdefault(s, []).append((b, b + n))
    for t, total in zip(rec.trace, d.totals):
        got = sorted(spans.get(t.step, []))
        assert [lo for lo, _ in got] == [0] + [hi for _, hi in got[:-1]], f"step {t.step}: stacked, no gap"
        assert total == got[-1][1] == t.num_tokens + sum(t.draft_tokens.values()), f"step {t.step}: 1 + k a decode"


def test_the_guesses_have_their_own_patterns_and_legend(spec_run):
    colors = ColorMap()
    fig = batch_chart(spec_run.trace, colors)
    accepted, rejected = fig.data[2:4]
    assert accepted.marker.pattern.shape == "-" and rejected.marker.pattern.shape == "\\"
    assert list(accepted.marker.color) == [colors(r.split(" · ")[1].split(":")[0]) for r in accepted.hovertext]
    assert all(c.startswith("rgba(") for c in rejected.marker.color), "rejected guesses are hollow: a tint"
    names = [t.name for t in fig.data if t.showlegend]
    assert names[:4] == [GUESS_LABELS["verified"], GUESS_LABELS["accepted"], GUESS_LABELS["rejected"],
                         PHASE_LABELS["prefill"]]
    frame = dashboard_frame(spec_run, len(spec_run) - 1, ColorMap(), FrameOptions())
    for label in GUESS_LABELS.values():
        assert label in frame["legend"]
    assert PHASE_LABELS["decode"] not in frame["legend"], "the decode swatch is the verified token"
    i = max(i for i, t in enumerate(spec_run.trace) if len(t.draft_tokens) > 1)
    t = spec_run.trace[i]
    status = dashboard_frame(spec_run, i, ColorMap(), FrameOptions())["status"]
    assert f"{sum(t.draft_tokens.values())} guessed, {sum(t.accepted_tokens.values())} accepted" in status


def test_without_speculation_the_view_is_as_before(plain_run):
    rec = plain_run
    assert not any(t.draft_tokens for t in rec.trace)
    fig = batch_figure(rec.trace, legend=False)
    assert [t["name"] for t in fig["data"]] == ["decode", "prefill"], "no speculation traces, not even empty"
    assert batch_data(rec.trace).totals == [t.num_tokens for t in rec.trace]
    assert not any("guess" in h or "verified" in h for h in fig["data"][0]["hovertext"])
    names = [t.name for t in batch_chart(rec.trace).data if t.showlegend]
    assert names[:2] == [PHASE_LABELS["decode"], PHASE_LABELS["prefill"]]
    frame = dashboard_frame(rec, len(rec) - 1, ColorMap(), FrameOptions())
    assert "guess" not in frame["legend"] and "verified" not in frame["legend"] and "guessed" not in frame["status"]


def test_a_window_without_guesses_shows_no_guess_legend(spec_run):
    """Guesses start with the first decode: a frame of the prefill steps only has none to explain."""
    first = next(i for i, t in enumerate(spec_run.trace) if t.draft_tokens)
    frame = dashboard_frame(spec_run, first - 1, ColorMap(), FrameOptions())
    assert "guess" not in frame["legend"] and len(frame["views"]["batch"]["data"]) == 2
    # ... and neither has a window past them: the last step decodes its last token without a guess
    last = len(spec_run) - 1
    assert not spec_run.trace[last].draft_tokens
    frame = dashboard_frame(spec_run, last, ColorMap(), FrameOptions(window=1))
    assert "guess" not in frame["legend"] and len(frame["views"]["batch"]["data"]) == 2


def test_a_saved_recording_replays_its_guesses(spec_run, tmp_path):
    spec_run.save(tmp_path / "spec.jsonl")
    back = Recording.load(tmp_path / "spec.jsonl")
    assert batch_figure(back.trace) == batch_figure(spec_run.trace)


def test_prompt_lookup_on_the_tiny_model_is_drawn_as_the_engine_counted(tiny):
    """The real runner: guesses from prompt lookup, verified by the model; the bars are the trace's counts."""
    engine = tiny_engine(tiny, num_blocks=64, speculative_config={"method": "ngram", "num_speculative_tokens": 3,
                                                                  "prompt_lookup_min": 1, "prompt_lookup_max": 3})
    for i, p in enumerate(["abcabcabcabcabcabc", "hello world " * 4, "xyz"]):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    rec = Recorder(engine)
    while not rec.done():
        rec.step()
    d = batch_data(rec.recording.trace)
    assert d.guesses == {(t.step, r): (k, t.accepted_tokens[r]) for t in rec.recording.trace
                     for r, k in t.draft_tokens.items() if k}
    stats = SpecDecodeStats.of(rec.recording.trace)
    assert sum(d.accepted.tokens) == stats.num_accepted_tokens and stats.num_draft_tokens > 0
    assert sum(d.rejected.tokens) == stats.num_draft_tokens - stats.num_accepted_tokens


def test_the_static_view_draws_the_guesses(spec_run):
    """The stored picture is drawn by views.js in Chromium: it draws one bar per guess bar of the figure."""
    from minfer.viz.snapshot import CHROMIUM, CHROMIUM_ARGS, DRAW, PAGE, WIDTH, browser_missing
    from minfer.viz.widget import plotly_js, static_text

    if why := browser_missing():
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    frame = dashboard_frame(spec_run, len(spec_run) - 1, ColorMap(), FrameOptions(window=12))
    views = frame["views"]["batch"]["data"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": WIDTH + 16, "height": 800})
            page.set_content(PAGE.format(width=WIDTH, css=static_text("dashboard.css")))
            page.add_script_tag(content=plotly_js())
            page.add_script_tag(content=static_text("views.js") + "\nglobalThis.MinferViews = MinferViews;")
            page.evaluate(DRAW, json.loads(json.dumps(frame)))
            drawn = page.evaluate("""() => [...document.querySelectorAll('.minfer-batch-chart g.trace.bars')]
                .map((g) => [...g.querySelectorAll('g.point path')].filter((p) => p.getAttribute('d') !== 'M0,0Z')
                .length)""")
            legend = page.inner_text(".minfer-legend")
        finally:
            browser.close()
    assert drawn == [len(t["x"]) for t in views] and drawn[2] > 0 and drawn[3] > 0, drawn
    assert GUESS_LABELS["accepted"] in legend and GUESS_LABELS["rejected"] in legend
