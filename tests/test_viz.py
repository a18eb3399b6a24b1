"""The views hold the numbers of the data they were given: checked on the figure data, no browser."""

from __future__ import annotations

import pytest

from conftest import tiny_engine as engine_with_checks
from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.kv.block_pool import BlockPool
from minfer.request import RequestMetrics
from minfer.trace import load_trace, save_trace
from minfer.viz import (
    SCENARIOS,
    ColorMap,
    Dashboard,
    Knobs,
    Recorder,
    Recording,
    batch_chart,
    batch_data,
    block_grid,
    grid_data,
    latency_chart,
    latency_data,
    queue_chart,
    request_metrics,
    scenario,
    step_states,
    timeline_chart,
    timeline_data,
)
from minfer.viz.blocks import CELL
from minfer.viz.latency import latency_figure, short_duration
from minfer.viz.style import BLOCK_RIM, CACHED_RIM

SMALL = dict(block_size=4, num_blocks=16, max_num_seqs=4, chunked_prefill_size=8)  # pressure comes quickly


def tiny_engine(tiny, **kw) -> LLMEngine:
    """conftest's tiny engine (invariants checked after every step) with a small pool."""
    return engine_with_checks(tiny, **(SMALL | kw))


def add_requests(engine: LLMEngine, n: int = 6, arrival_gap: float = 0.0) -> None:
    for i in range(n):
        engine.add_request(f"r{i}", list(range(10, 19 + i)), SamplingParams(max_tokens=8, ignore_eos=True,
                           temperature=0.0), arrival_time=i * arrival_gap)


def record(engine: LLMEngine) -> Recording:
    """Step through a Recorder, checking the scheduler's invariants after every step (as run_checked)."""
    rec = Recorder(engine)
    while not rec.done():
        rec.step()
        engine.scheduler.check_invariants()
    rec.sync_metrics()
    return rec.recording


@pytest.fixture(scope="module")
def pressured(tiny) -> tuple[LLMEngine, Recording]:
    """Six requests in a 16-block pool: chunked prefills, continuous batching and at least one preemption."""
    engine = tiny_engine(tiny)
    add_requests(engine)
    rec = record(engine)
    assert any(t.preempted for t in rec.trace), "the fixture should preempt (make the pool smaller)"
    return engine, rec


# ---- batch composition ---------------------------------------------------------------------------
def test_batch_bars_equal_the_trace_counts(pressured):
    _, rec = pressured
    d = batch_data(rec.trace)
    for t in rec.trace:
        pre = {r: n for s, r, n in zip(d.prefill.step, d.prefill.request, d.prefill.tokens) if s == t.step}
        dec = {r: n for s, r, n in zip(d.decode.step, d.decode.request, d.decode.tokens) if s == t.step}
        assert pre == t.prefill_tokens and dec == t.decode_tokens, f"step {t.step}"
    assert d.totals == [t.num_tokens for t in rec.trace]

    fig = batch_chart(rec.trace)
    decode, prefill = fig.data[:2]  # then legend-only swatches
    assert list(prefill.y) == d.prefill.tokens and list(prefill.x) == d.prefill.step
    assert list(decode.y) == d.decode.tokens and list(decode.x) == d.decode.step
    assert prefill.marker.pattern.shape == "/" and not decode.marker.pattern.shape, "prefill is hatched"
    # stacked: in each step, every bar starts where the one below it ends, and the top is the step's total
    for t in rec.trace:
        spans = sorted((b, b + n) for x, b, n in [*zip(decode.x, decode.base, decode.y),
                                                   *zip(prefill.x, prefill.base, prefill.y)] if x == t.step)
        assert [lo for lo, _ in spans] == [0] + [hi for _, hi in spans[:-1]]
        assert (spans[-1][1] if spans else 0) == t.num_tokens


def test_batch_colours_follow_the_request(pressured):
    _, rec = pressured
    d = batch_data(rec.trace)
    decode, prefill = batch_chart(rec.trace).data[:2]
    colour: dict[str, str] = {}
    for r, c in [*zip(d.decode.request, decode.marker.color), *zip(d.prefill.request, prefill.marker.color)]:
        assert colour.setdefault(r, c) == c, f"{r} drawn in two colours"
    assert len(colour) == 6 and len(set(colour.values())) == 6, "each request has its own colour"


def test_timeline_states_match_the_trace(pressured):
    engine, rec = pressured
    states = step_states(rec.trace, rec.metrics)
    for t, s in zip(rec.trace, states):
        assert {r for r, x in s.items() if x == "prefill"} == set(t.prefill_tokens)
        assert {r for r, x in s.items() if x == "decode"} == set(t.decode_tokens)
        for r in t.preempted:
            assert s[r] == "preempted"
        # all six arrived at time 0, so the queue the timeline shows is the scheduler's queue
        assert sum(x in ("waiting", "preempted") for x in s.values()) == t.num_waiting, f"step {t.step}"
    d = timeline_data(rec.trace, rec.metrics)
    assert d.requests == [f"r{i}" for i in range(6)]
    assert sorted((f.request, f.step) for f in d.finishes) == sorted(
        (r, t.step) for t in rec.trace for r in t.finished)
    # segments tile each request's life: per step, exactly the state step_states gave it
    for seg in d.segments:
        for step in range(seg.start, seg.end):
            assert states[step][seg.request] == seg.state
    assert sum(s.end - s.start for s in d.segments) == sum(len(s) for s in states)
    # a window over the last half keeps the states worked out from the start (running, preempted)
    k = rec.trace[len(rec.trace) // 2].step
    window = timeline_data(rec.trace, rec.metrics, since=k)
    cells = {(s.request, step, s.state) for s in window.segments for step in range(s.start, s.end)}
    assert cells == {(r, t.step, x) for t, st in zip(rec.trace, states) if t.step >= k for r, x in st.items()}
    fig = timeline_chart(rec.trace, rec.metrics)
    preempted_bars = fig.data[4]
    assert fig.data[4].name == "preempted" and len(preempted_bars.y) == sum(
        s.state == "preempted" for s in d.segments) > 0
    assert list(fig.data[5].y) == [f.request for f in d.finishes]
    from minfer.viz.narration import FINISH_WORDS

    assert list(fig.data[5].hovertext) == [f"{f.request} finished at step {f.step}: {f.why}" for f in d.finishes]
    assert not {f.why for f in d.finishes} & set(FINISH_WORDS.values()), "each ending in its own words"


def test_timeline_shows_waiting_from_arrival(tiny):
    engine = tiny_engine(tiny, max_num_seqs=1)
    add_requests(engine, n=3, arrival_gap=0.0)
    rec = record(engine)
    first = {r: next(t.step for t in rec.trace if r in t.admitted) for r in ("r0", "r1", "r2")}
    d = timeline_data(rec.trace, rec.metrics)
    waits = {s.request: (s.start, s.end) for s in d.segments if s.state == "waiting"}
    assert "r0" not in waits and waits["r1"] == (0, first["r1"]) and waits["r2"] == (0, first["r2"])
    no_metrics = timeline_data(rec.trace)  # a bare trace has no arrival times: no waiting bars
    assert not any(s.state == "waiting" for s in no_metrics.segments)


# ---- block occupancy -----------------------------------------------------------------------------
def shared_pool() -> BlockPool:
    """a: 3 blocks (2 full, 1 partly); b shares a's two cached blocks and adds one; c frees a cached one."""
    pool = BlockPool(12, 4)
    pool.append_slots("a", 10)
    pool.cache_blocks("a", [101, 102], 10)
    pool.share("b", pool.lookup([101, 102]))
    pool.append_slots("b", 3)
    pool.append_slots("c", 4)
    pool.cache_blocks("c", [201], 4)
    pool.free("c")
    pool.check_invariants()
    return pool


def test_grid_cells_equal_the_snapshot():
    snap = shared_pool().snapshot()
    d = grid_data(snap, columns=4)
    assert d.owners == snap.owners() and d.filled == snap.filled and d.cached == snap.cached
    assert (d.row[5], d.col[5]) == (1, 1)
    assert d.num_shared == 2 and d.num_free_cached == 1
    assert d.internal_waste == snap.internal_waste == 2 + 1  # a's last block 2/4, b's 3/4
    assert d.utilization == snap.utilization == 4 / 12

    fig = block_grid(snap, columns=4)
    cells, tokens, labels = fig.data
    assert len(cells.x) == 12 and len(tokens.x) == snap.num_used == 4
    used = [b for b in range(12) if snap.ref_counts[b]]
    assert list(tokens.y) == pytest.approx([CELL * snap.filled[b] / 4 for b in used]), "fill level = slots"
    assert list(tokens.marker.pattern.shape) == ["/" if snap.ref_counts[b] > 1 else "" for b in used]
    assert list(cells.marker.line.color) == [CACHED_RIM if c else BLOCK_RIM for c in snap.cached]
    assert list(labels.text) == ["×2" if snap.ref_counts[b] > 1 else snap.owners()[b][0] for b in used]
    assert "4/12 in use" in fig.layout.title.text and "1 free but cached" in fig.layout.title.subtitle.text
    a, b = fig.data[1].marker.color[2], fig.data[1].marker.color[3]  # a's own block, b's own block
    assert a != b


def test_grid_caps_large_pools():
    pool = BlockPool(3000, 16)
    pool.append_slots("x", 16 * 2000)
    d = grid_data(pool.snapshot(), max_blocks=1024)
    assert len(d.blocks) == 1024 and d.num_blocks == 3000 and d.columns == 32
    assert "showing blocks 0–1023" in block_grid(pool.snapshot()).layout.title.text


def test_recorder_snapshots_match_the_trace(pressured):
    _, rec = pressured
    assert len(rec.snapshots) == len(rec.trace)
    for t, snap in zip(rec.trace, rec.snapshots):
        assert {o: len(tb) for o, tb in snap.tables.items()} == t.blocks, f"step {t.step}"
        assert snap.num_free == t.num_free_blocks


def test_recorder_keeps_every_request_of_an_engine_that_keeps_few(tiny):
    """A serving engine keeps only its latest finished requests; the recording still has every one."""
    engine = tiny_engine(tiny, finished_window=1)
    add_requests(engine)
    rec = record(engine)
    assert len(engine.finished) == 1 and set(rec.metrics) == {f"r{i}" for i in range(6)}


# ---- queues, memory, latency ---------------------------------------------------------------------
def test_queue_chart_holds_the_trace(pressured):
    _, rec = pressured
    fig = queue_chart(rec.trace)
    steps = [t.step for t in rec.trace]
    # each step's value spans the step's width, the last one included (it used to be a point at the edge)
    assert list(fig.data[0].x) == [s - 0.5 for s in steps] + [steps[-1] + 0.5]
    assert list(fig.data[0].y) == [t.num_waiting for t in rec.trace] + [rec.trace[-1].num_waiting]
    assert list(fig.data[1].y)[:-1] == [t.num_running for t in rec.trace]
    used = [t.num_blocks - t.num_free_blocks for t in rec.trace]
    assert list(fig.data[4].y) == used + used[-1:]
    assert list(fig.data[6].y) == [16, 16]
    # preemption marks name their requests
    hit = [t for t in rec.trace if t.preempted]
    assert list(fig.data[3].x) == [t.step for t in hit]
    assert list(fig.data[3].text) == [", ".join(t.preempted) for t in hit]
    assert all(f"preempted {t.preempted[0]}" in h for t, h in zip(hit, fig.data[3].hovertext))
    # a series that stays zero (nobody still to arrive, nothing cached) is left out of the legend
    assert not fig.data[2].showlegend and not fig.data[5].showlegend


def test_latency_chart_holds_the_metrics(pressured):
    engine, rec = pressured
    metrics = request_metrics(engine)
    ttft = sorted(m.ttft for m in metrics.values())
    d = latency_data(metrics)
    assert sorted(d.ttft) == ttft and len(d.itl) == sum(len(m.token_times) - 1 for m in metrics.values())
    slo = ttft[len(ttft) // 2]
    fig = latency_chart(metrics, ttft_slo=slo, itl_slo=0.5)
    for bars, values in ((fig.data[0], ttft), (fig.data[1], d.itl)):  # the bars count the values in their bins
        size = bars.x[1] - bars.x[0]
        assert bars.x[0] == pytest.approx(size / 2), "bins start at zero"
        assert list(bars.y) == [sum(x - size / 2 <= v * 1e3 < x + size / 2 for v in values) for x in bars.x]
        assert sum(bars.y) == len(values) and len(bars.x) <= 31
    assert [s.x0 for s in fig.layout.shapes] == pytest.approx([slo * 1e3, 500])
    share = sum(v <= slo for v in ttft) / len(ttft)
    assert f"{share:.0%} within SLO" in fig.layout.annotations[0].text
    # scrubbed back to step 5: only tokens that existed by then
    until = rec.trace[5].end_time
    early = latency_data(metrics, until=until)
    assert len(early.ttft) == sum(m.first_token_time <= until for m in metrics.values()) < len(ttft)


def test_latency_titles_keep_their_width_on_a_slow_machine():
    """Milliseconds up to a second, then seconds: a busy CPU's multi-second ITLs must not widen the title (four-digit
    milliseconds pushed it past the chart's edge at the lecture layout's doubled font)."""
    assert [short_duration(s) for s in (0.0054, 0.2281, 0.9994, 2.281, 35.28)] == [
        "5 ms", "228 ms", "999 ms", "2.28 s", "35.3 s"]
    fast, slow = (latency_figure([RequestMetrics(0.0, first_token_time=t, token_times=[t, 2 * t])])
                  for t in (0.3141, 3.141))
    titles = [[a["text"] for a in f["layout"]["annotations"]] for f in (fast, slow)]
    assert titles[1] == ["TTFT: p50 3.14 s · p99 3.14 s", "ITL: p50 3.14 s · p99 3.14 s"]
    assert [len(t) for t in titles[1]] == [len(t) for t in titles[0]], titles


# ---- recordings on disk --------------------------------------------------------------------------
def test_recording_round_trips_through_a_file(pressured, tmp_path):
    _, rec = pressured
    path = tmp_path / "run.jsonl"
    rec.save(path)
    back = Recording.load(path)
    assert back.trace == rec.trace and back.snapshots == rec.snapshots
    assert any(t.decisions for t in back.trace), "the decisions come back as records (equal to the originals)"
    assert back.metrics == rec.metrics
    assert load_trace(path) == rec.trace, "a recording is also a plain trace file"
    save_trace(rec.trace, tmp_path / "bare.jsonl")
    bare = Recording.load(tmp_path / "bare.jsonl")
    assert bare.trace == rec.trace and bare.snapshots == [None] * len(rec) and not bare.metrics
    assert bare.snapshot_at(3) is None


def test_snapshot_at_falls_back_to_the_latest_kept(tiny):
    engine = tiny_engine(tiny)
    add_requests(engine, n=2)
    rec = Recorder(engine, keep_snapshots=False)
    rec.run()
    last = len(rec.recording) - 1
    assert [i for i, s in enumerate(rec.recording.snapshots) if s is not None] == [last] and last > 2
    assert rec.recording.snapshot_at(last)[0] == last and rec.recording.snapshot_at(2) is None


# ---- the dashboard -------------------------------------------------------------------------------
def view(dash: Dashboard, name: str) -> dict:
    """A view's figure as the browser gets it (plotly JSON in the dashboard's current frame)."""
    return dash.view.frame["views"][name]


def test_live_dashboard_throttles_and_ends_exact(tiny, monkeypatch):
    engine = tiny_engine(tiny)
    add_requests(engine)
    dash = Dashboard(engine, refresh_interval=1e9)  # throttle: no redraw while running
    draws = []
    original = Dashboard.draw
    monkeypatch.setattr(Dashboard, "draw", lambda self, i=None: (draws.append(i), original(self, i)))
    rec = dash.run()
    assert draws == [None], "one final exact frame, none in between"
    assert dash.slider.max == len(rec) - 1 == dash.slider.value == dash.index
    d = batch_data(rec.trace)
    assert view(dash, "batch")["data"][1]["y"] == d.prefill.tokens
    assert view(dash, "batch")["data"][0]["y"] == d.decode.tokens
    grid = view(dash, "grid")["data"]
    assert len(grid[0]["x"]) == 16 and not grid[1]["x"], "all blocks freed at the end"
    assert f"<b>step {rec.trace[-1].step}</b>" in dash.view.frame["status"]
    assert not any(b.disabled for b in dash._play_buttons), "the buttons work again once run() returns"


def test_before_the_first_step_the_pool_is_drawn_empty(tiny):
    engine = tiny_engine(tiny)
    add_requests(engine)
    frame = Dashboard(engine).view.frame
    cells, tokens, _ = frame["views"]["grid"]["data"]
    assert len(cells["x"]) == 16 and not tokens["x"], "16 free blocks, not 'no snapshot'"
    assert "0/16 in use" in frame["views"]["grid"]["layout"]["title"]["text"]
    assert "no steps yet" in frame["status"] and "step 0 of 0" not in frame["status"]
    batch = frame["views"]["batch"]["layout"]
    assert batch["xaxis"]["dtick"] >= 1 and batch["xaxis"]["range"][0] == -0.5, "integer step ticks, no ±0.4"


def test_run_button_steps_in_the_background_until_paused(tiny):
    import asyncio

    engine = tiny_engine(tiny)
    add_requests(engine)
    dash = Dashboard(engine, refresh_interval=0.0)

    async def session() -> None:
        dash.start()  # the Run button: each step hands the event loop back (the kernel's, in Jupyter)
        while len(dash.recording) < 3:
            await asyncio.sleep(0.005)
        dash.pause()
        paused_at = len(dash.recording)
        await asyncio.sleep(0.1)
        assert len(dash.recording) == paused_at, "Pause stops the run before its next step"
        assert not dash.running and dash.index == paused_at - 1
        dash.start()
        await dash._task
        assert dash.recorder.done() and dash.slider.value == len(dash.recording) - 1
        assert "running at" not in dash.view.frame["status"], "the last frame says the run stopped"

    asyncio.run(session())


def test_paced_run_draws_every_step_and_waits_for_a_watching_browser(tiny):
    """At a chosen pace every step is drawn; while a browser reports frames drawn, the engine waits for
    it (never more than a step ahead of the screen); a browser that stops reporting stops being waited for."""
    import asyncio

    engine = tiny_engine(tiny)
    add_requests(engine)
    dash = Dashboard(engine, steps_per_second=100.0, refresh_interval=0.0)
    first = dash.view.serial

    async def session() -> None:
        await dash.play(max_steps=4)
        assert len(dash.recording) == 4 and dash.view.serial - first == 4 + 1, "a frame per step, one at the end"
        dash.view._handle(None, {"event": "drawn", "serial": dash.view.serial, "ms": 5.0}, [])  # a browser
        assert dash.view.watched
        dash.start()
        await asyncio.sleep(0.1)
        assert len(dash.recording) == 5, "one step, then it waits for the browser to draw it"
        dash.view._handle(None, {"event": "drawn", "serial": dash.view.serial, "ms": 5.0}, [])
        await asyncio.sleep(0.1)
        assert len(dash.recording) == 6
        dash.pause()
        await dash._task

    asyncio.run(session())
    assert dash.view.draw_ms == [5.0, 5.0]


def test_arrow_keys_step_and_scrub(tiny):
    engine = tiny_engine(tiny)
    add_requests(engine, n=2)
    dash = Dashboard(engine)
    dash._on_key("ArrowRight")  # at the newest step: the engine takes its next step
    dash._on_key("ArrowRight")
    assert len(dash.recording) == 2 and dash.index == 1
    dash._on_key("ArrowLeft")  # back: scrubs the recording, the engine stays where it is
    assert len(dash.recording) == 2 and dash.index == 0 and dash.slider.value == 0
    dash._on_key("ArrowRight")  # forward again over recorded steps before stepping the engine
    assert len(dash.recording) == 2 and dash.index == 1


def test_dashboard_scrubs_and_replays(pressured, tmp_path):
    import asyncio

    _, rec = pressured
    path = tmp_path / "run.jsonl"
    rec.save(path)
    dash = Dashboard(recording=Recording.load(path), steps_per_second=0.0)
    k = max(range(len(rec)), key=lambda i: rec.snapshots[i].num_used)  # the fullest step
    dash.slider.value = k  # as a user dragging the slider
    snap = rec.snapshots[k]
    tokens = view(dash, "grid")["data"][1]
    assert len(tokens["x"]) == snap.num_used
    assert tokens["y"] == pytest.approx(
        [CELL * snap.filled[b] / snap.block_size for b in range(snap.num_blocks) if snap.ref_counts[b]])
    assert view(dash, "queues")["data"][0]["y"][:-1] == [t.num_waiting for t in rec.trace[: k + 1]]
    with pytest.raises(ValueError, match="cannot run"):
        dash.run()
    shown = []
    send = dash.view.show
    dash.view.show = lambda frame: (shown.append(frame["step"]), send(frame))[1]
    dash.refresh_interval = 0.0
    asyncio.run(dash.play())  # Play, flat out: to the end of the recording, frame by frame
    assert dash.index == len(rec) - 1 and shown == sorted(shown) and shown[0] == k + 1, shown
    asyncio.run(dash.play(max_steps=3))  # Play at the end starts over
    assert dash.index == 2


def test_dashboard_builds_engines_from_its_knobs():
    dash = Dashboard(knobs=Knobs(backend="sim", scenario="bursts (memory pressure)", num_blocks=40))
    assert dash.engine.config.executor == "sim" and dash.engine.block_pool.num_blocks == 40
    rec = dash.run()
    assert rec.trace and not dash.engine.has_unfinished_requests()
    assert sum(len(t.preempted) for t in rec.trace) > 0, "40 blocks are too few for the bursts"
    dash.reset(num_blocks=200, enable_prefix_caching=True)
    assert dash.engine.block_pool.num_blocks == 200 and dash.engine.config.enable_prefix_caching
    assert len(dash.recording) == 0 and dash.controls["num_blocks"].value == 200
    with pytest.raises(ValueError, match="unknown knob"):
        dash.reset(num_blockz=3)
    engine = dash.engine
    dash.controls["scenario"].value, dash.controls["num_blocks"].value = "long prompt spike", 8
    assert "not applied yet" in dash.pending.value and "KV blocks 8 (running: 200)" in dash.pending.value
    assert dash.apply_button.description == "Apply & reset (2)"
    dash._apply()  # the Apply button: 8 blocks cannot hold the 256-token prompt
    assert "not applied" in dash.message.value and "num_blocks" in dash.message.value
    assert dash.engine is engine and dash.knobs.num_blocks == 200, "a refused knob changes nothing"
    assert "not applied yet" in dash.pending.value, "the refused values still show as not applied"
    dash.controls["num_blocks"].value = 64
    dash._apply()
    assert dash.knobs.num_blocks == 64 and dash.knobs.scenario == "long prompt spike"
    assert dash.pending.value == "" and dash.apply_button.description == "Apply & reset"


def test_font_scale_grows_every_text(tiny):
    engine = tiny_engine(tiny)
    add_requests(engine)
    dash = Dashboard(engine)
    dash.run()
    small = {n: v["layout"]["font"]["size"] for n, v in dash.view.frame["views"].items()}
    dash.font.value = 2.0  # the font knob
    big = dash.view.frame
    assert big["scale"] == 2.0  # the status, narration and legend lines scale in CSS by this factor
    assert {n: v["layout"]["font"]["size"] for n, v in big["views"].items()} == {n: 2 * s for n, s in small.items()}
    with pytest.raises(ValueError, match="font_scale"):
        Dashboard(engine, font_scale=3.0)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenarios_fit_the_tiny_model_and_run_in_the_simulator(tiny, name):
    from minfer.workload import submit

    items = scenario(name)
    submit(tiny_engine(tiny, num_blocks=64, block_size=16), items)  # ids in the vocabulary, prompts fit
    engine = LLMEngine(EngineConfig(model="llama-3-8b", executor="sim", hardware="H100-SXM", num_blocks=64,
                                    max_num_seqs=8, chunked_prefill_size=64, enable_prefix_caching=True))
    submit(engine, scenario(name, time_scale=0.05))
    rec = record(engine)
    assert len(rec.metrics) == len(items) and all(m.finished_time is not None for m in rec.metrics.values())


def test_gpu_memory_is_shown_next_to_the_pool_on_cuda(monkeypatch):
    """No GPU here: a stand-in engine and torch.cuda's counters faked, to check what the text reports."""
    from types import SimpleNamespace

    import torch

    from minfer.viz.dashboard import gpu_memory_text
    from minfer.viz.recorder import gpu_memory_allocated

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda dev=None: 3 * gib)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev=None: 4 * gib)
    props = SimpleNamespace(total_memory=80 * gib)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "Fake GPU")
    engine = SimpleNamespace(config=SimpleNamespace(executor="model", device="cuda"),
                             kv_cache=SimpleNamespace(nbytes=2 * gib),
                             block_pool=SimpleNamespace(num_blocks=1024))
    text = gpu_memory_text(engine)
    assert "3.00 GiB allocated" in text and "4.00 GiB reserved of 80.0 GiB" in text
    assert "KV pool holds 2.00 GiB (1024 blocks × 2.00 MiB)" in text
    assert gpu_memory_allocated(engine) == 3 * gib
    engine.config.device = "cpu"
    assert gpu_memory_text(engine) == "" and gpu_memory_allocated(engine) is None


# ---- the course style ----------------------------------------------------------------------------
def test_request_hues_never_look_like_a_phase():
    """Issue: orange was request r4 *and* "prefill", teal decode *and* r2. Request hues keep clear of the
    phase colours (greys and the alarm red) and of each other, by a visible margin (CIE76 delta E)."""
    from itertools import combinations

    from minfer.viz import style

    reserved = [*style.PHASE_COLORS.values(), style.CACHED_RIM, style.BLOCK_RIM, style.FREE_BLOCK, style.NEUTRAL,
                style.REFERENCE_LINE]
    for hue in style.REQUEST_HUES:
        assert style.saturation(hue) > 0.25, f"{hue} is nearly grey: greys mean phases"
        near = min(reserved, key=lambda c: style.color_distance(hue, c))
        assert style.color_distance(hue, near) > 25, f"request hue {hue} looks like reserved {near}"
    for a, b in combinations(style.REQUEST_HUES, 2):
        assert style.color_distance(a, b) > 20, f"two requests in look-alike hues {a}, {b}"
    assert style.color_distance(style.ALARM, style.REQUEST_HUES[1]) > 25, "orange is not the preemption red"


def test_every_view_follows_the_course_style(pressured):
    """Titled numeric axes, no fixed width, one template: for each figure a chapter or the dashboard draws."""
    from minfer.viz import style
    from minfer.viz.frame import FrameOptions, dashboard_frame

    engine, rec = pressured
    metrics = request_metrics(engine)
    figures = {"batch": batch_chart(rec.trace), "timeline": timeline_chart(rec.trace, metrics),
               "grid": block_grid(rec.snapshots[5]), "queues": queue_chart(rec.trace),
               "latency": latency_chart(metrics, ttft_slo=0.5, itl_slo=0.1)}
    for name, fig in figures.items():
        assert style.check_figure(fig) == [], name
    frame = dashboard_frame(rec, len(rec) - 1, style.ColorMap(), FrameOptions(scale=1.5))
    for name, spec in frame["views"].items():
        assert style.check_figure(spec) == [], name
    # and the check does catch what breaks the style
    import plotly.graph_objects as go

    bad = go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout=dict(width=480, xaxis_title="step"))
    problems = style.check_figure(bad)
    assert any("fixed width" in p for p in problems) and any("yaxis has no title" in p for p in problems)
    assert any("template" in p for p in problems)
    style.apply(bad).update_yaxes(title_text="tokens")  # a figure made elsewhere, put in the course style
    assert style.check_figure(bad) == []


def test_phases_are_patterns_over_request_hues(pressured):
    """In the dashboard's timeline colour means the request, the pattern the phase; preempted is red."""
    from minfer.viz import style

    engine, rec = pressured
    colors = style.ColorMap()
    fig = timeline_chart(rec.trace, request_metrics(engine), colors)
    by_name = {t.name: t for t in fig.data[:5]}
    assert by_name["prefill"].marker.pattern.shape == "/" and by_name["preempted"].marker.pattern.shape == "x"
    decode = by_name["decode"]
    assert list(decode.marker.color) == [colors(r) for r in decode.y], "decode bars in their request's hue"
    assert by_name["preempted"].marker.line.color == style.ALARM
    # the legend swatches are the phases' own (grey, patterned), never some request's hue
    swatches = [t for t in fig.data if t.showlegend]
    assert {t.marker.color for t in swatches if t.legendgroup.startswith("phase:")} <= {
        style.PHASE_COLORS["prefill"], style.PHASE_COLORS["decode"],
        style.rgba(style.PHASE_COLORS["prefill"], style.WAITING_FILL),
        style.rgba(style.PHASE_COLORS["prefill"], style.STALLED_FILL), style.rgba(style.ALARM, 0.18)}


# ---- readable at a distance: contrast, colour vision, 32 requests ---------------------------------------
def test_contrast_ratio_of_known_pairs():
    """WCAG's own numbers: black on white is 21:1, a colour on itself 1:1, #767676 is the lightest grey that
    passes 4.5:1 on white and #777777 just fails it."""
    from minfer.viz import style

    assert style.relative_luminance("#ffffff") == pytest.approx(1.0)
    assert style.relative_luminance("#000000") == 0.0
    assert style.contrast_ratio("#000000", "#ffffff") == pytest.approx(21.0)
    assert style.contrast_ratio("#ffffff", "#000000") == pytest.approx(21.0), "either order"
    assert style.contrast_ratio("#f2b701", "#f2b701") == pytest.approx(1.0)
    assert style.contrast_ratio("#767676", "#ffffff") == pytest.approx(4.54, abs=0.01)
    assert style.contrast_ratio("#777777", "#ffffff") == pytest.approx(4.48, abs=0.01)
    assert style.contrast_ratio("#f2b701", "#f4f6f8") < 2, "gold on the narration's grey: why names are chips"


def test_chip_text_reaches_4_5_to_1_on_every_background():
    """Black or white, whichever contrasts more: on every request hue, on the alarm red, and on any colour at
    all (a 16-level sweep of the RGB cube), the chip's text meets WCAG AA."""
    from itertools import product

    from minfer.viz import style

    assert style.text_color("#ffffff") == style.DARK_TEXT and style.text_color("#000000") == style.LIGHT_TEXT
    assert style.text_color("#f2b701") == style.DARK_TEXT and style.text_color("#0d47a1") == style.LIGHT_TEXT
    for hue in (*style.REQUEST_HUES, style.ALARM):
        ratio = style.contrast_ratio(hue, style.text_color(hue))
        assert ratio >= style.MIN_TEXT_CONTRAST, f"{style.text_color(hue)} on {hue} is {ratio:.2f}:1"
    levels = range(0, 256, 17)
    worst = min(style.contrast_ratio(c, style.text_color(c))
                for c in (f"#{r:02x}{g:02x}{b:02x}" for r, g, b in product(levels, levels, levels)))
    assert worst >= style.MIN_TEXT_CONTRAST, f"some background gets only {worst:.2f}:1"


def test_32_requests_get_32_distinct_colours():
    """Issue 37: an 18-request replay showed r12-r17 in r0-r5's colours. 32 requests now get 32 colours --
    distinct (colour, label) pairs, and colours a reader tells apart (delta E > 20, as the first twelve)."""
    from itertools import combinations

    from minfer.viz import style

    colors = style.ColorMap()
    ids = [f"r{i}" for i in range(32)]
    pairs = {(colors(r), r) for r in ids}
    assert len(pairs) == 32 and len({c for c, _ in pairs}) == 32, "a colour repeats within 32 requests"
    worst = min(style.color_distance(colors(a), colors(b)) for a, b in combinations(ids, 2))
    assert worst > 20, f"two of 32 requests are only delta E {worst:.1f} apart"
    assert colors("r32") == colors("r0"), "past 32 the colours come round again (the name tells them apart)"


def test_colorblind_simulation_keeps_greys_and_merges_red_with_green():
    """The simulation the phase test relies on: a neutral grey looks the same to everyone; red and green, far
    apart in normal vision, come close for a protan or deutan viewer but not for a tritan one."""
    from minfer.viz import style

    for kind in style.CVD_KINDS:
        for grey in ("#000000", "#808080", "#ffffff"):
            assert style.color_distance(style.colorblind(grey, kind), grey) < 1, (kind, grey)
    normal = style.color_distance("#d62728", "#2ca02c")
    for kind in ("protan", "deutan"):
        merged = style.color_distance(style.colorblind("#d62728", kind), style.colorblind("#2ca02c", kind))
        assert merged < normal / 3, f"{kind}: red and green stay {merged:.0f} apart"
    tritan = style.color_distance(style.colorblind("#d62728", "tritan"), style.colorblind("#2ca02c", "tritan"))
    assert tritan > normal / 2


def test_phase_colours_stay_apart_for_every_colour_vision():
    """Waiting, stalled, prefill, decode and preempted keep at least delta E 12 between any two, in normal
    vision and in simulated protan, deutan and tritan vision (the old stalled grey was 7 from waiting); and
    the alarm red keeps clear of every grey for every viewer."""
    from itertools import combinations

    from minfer.viz import style

    for kind in (None, *style.CVD_KINDS):
        seen = {p: c if kind is None else style.colorblind(c, kind) for p, c in style.PHASE_COLORS.items()}
        for a, b in combinations(seen, 2):
            distance = style.color_distance(seen[a], seen[b])
            assert distance >= 12, f"{a} and {b} are only {distance:.1f} apart in {kind or 'normal'} vision"
        greys = [c for p, c in seen.items() if p != "preempted"]
        assert min(style.color_distance(seen["preempted"], g) for g in greys) > 30, kind or "normal"


def _drawn_fill(color: str) -> str:
    """A marker colour as it looks over the white page: "rgba(r,g,b,a)" blended, "#rrggbb" as it is."""
    import re

    from minfer.viz import style

    m = re.fullmatch(r"rgba\((\d+),(\d+),(\d+),([\d.]+)\)", color)
    if not m:
        return color
    r, g, b, a = m.groups()
    return style.blend(f"#{int(r):02x}{int(g):02x}{int(b):02x}", float(a))


def test_state_fills_show_on_a_projector():
    """The timeline's fills, as drawn over white: for every request hue, waiting is at least delta E 12 from
    the white page (12% opacity was 7-11: gone on a projector) and stalled at least 12 from waiting and from
    the full hue of prefill and decode."""
    from minfer.viz import style

    for hue in style.REQUEST_HUES:
        fills = {p: _drawn_fill(style.phase_marker(p, [hue])["color"][0]) for p in ("waiting", "stalled", "decode")}
        assert style.color_distance(fills["waiting"], "#ffffff") >= 12, f"waiting {hue} fades into the page"
        assert style.color_distance(fills["waiting"], fills["stalled"]) >= 12, f"waiting vs stalled {hue}"
        assert style.color_distance(fills["stalled"], fills["decode"]) >= 12, f"stalled vs decode {hue}"


def plain_text(markup: str) -> str:
    """The words of an HTML fragment, tags dropped."""
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", markup))


CHIP = r"<span class='minfer-name' style='background:(#[0-9a-f]{6});color:(#[0-9a-f]{6})'>([^<]*)</span>"


def test_names_in_narration_and_legend_are_chips_that_read_at_4_5_to_1(pressured):
    """Every request named in the narration or the legend sits on a chip of its own hue, in text meeting
    4.5:1 against it; no text is written in a colour on the page instead (the old names, gold on grey, were
    1.7:1); and the requests that a phrase mentions ("r2 needed a block") are chips too, whole ids only."""
    import html
    import re

    from minfer.viz import style
    from minfer.viz.frame import FrameOptions, dashboard_frame, mark_names, named_requests

    _, rec = pressured
    colors = style.ColorMap()
    preempting = [i for i, t in enumerate(rec.trace) if t.preempted]
    assert preempting, "the fixture should preempt"
    for i in [*preempting, 0, len(rec) // 2, len(rec) - 1]:
        frame = dashboard_frame(rec, i, colors, FrameOptions())
        for part in ("narration", "legend"):
            chips = re.findall(CHIP, frame[part])
            assert chips, f"step {i}: no name chip in the {part}"
            for background, text, name in chips:
                assert style.contrast_ratio(background, text) >= style.MIN_TEXT_CONTRAST, (part, name, background)
                rid = html.unescape(name).split(" · ")[0]
                if rid in colors:
                    assert background == colors(rid), f"{rid} is not on its own hue"
            assert not re.search(r"style='color:", frame[part]), f"coloured text on the page in the {part}"
        outside = plain_text(re.sub(CHIP, " ", frame["narration"]))
        for rid in named_requests(rec.trace[i]):
            assert not re.search(rf"(?<![\w.-]){re.escape(rid)}(?![\w-])", outside), f"{rid} named outside a chip"
    marked = mark_names("pool full: r1 needed a block; r10 is <the most recent>, not r1x", ["r1", "r10"], colors)
    assert [name for _, _, name in re.findall(CHIP, marked)] == ["r1", "r10"], marked
    assert plain_text(marked).endswith("<the most recent>, not r1x"), "the rest is escaped text"


# ---- narration ----------------------------------------------------------------------------------
def test_narration_says_what_the_scheduler_decided(pressured):
    from minfer.viz import narrate, sentences

    _, rec = pressured
    for t in rec.trace:
        told = [(s.kind, s.request) for s in sentences(t)
                if s.kind not in ("chunked", "continued", "stalled", "kept waiting")]
        assert told == [*(("admitted", r) for r in t.admitted), *(("preempted", r) for r in t.preempted),
                        *(("finished", r) for r in t.finished)], f"step {t.step}"
        line = narrate(t)
        assert line.startswith(f"step {t.step} · ")
        for r in t.preempted:
            assert f"preempted {r} (" in line
    t = next(t for t in rec.trace if t.finished)
    assert f"finished {t.finished[0]} (max_tokens=" in narrate(t), "the finish reason in words"


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_no_step_reads_as_nothing_happened(policy):
    """Every scenario in the simulator: each step names every request that computed a prompt chunk, or every one
    that decoded when nothing else happened; a step after which requests wait says why the first of them was not
    admitted and how many wait behind it; a step without decisions names what it did."""
    from minfer.viz import Dashboard, Knobs, narrate, sentences
    from minfer.viz.scenarios import SCENARIOS

    for name in SCENARIOS:
        rec = Dashboard(knobs=Knobs(backend="sim", scenario=name, num_blocks=24, max_num_seqs=4,
                                    chunked_prefill_size=32, policy=policy)).run()
        for t in rec.trace:
            told, line = sentences(t), narrate(t)
            where = f"{name}, step {t.step}: {line}"
            named = {s.request for s in told}
            assert t.prefill_tokens.keys() <= named, f"a prompt chunk nobody names ({where})"
            if t.num_waiting:
                waits = [s for s in told if s.kind == "kept waiting"]
                assert len(waits) == 1, f"requests wait and the narration does not say why ({where})"
                if t.num_waiting > 1:
                    assert f"{t.num_waiting - 1} more wait" in waits[0].why, where
            if not told:
                assert t.decode_tokens and all(r in line for r in t.decode_tokens), where
                assert len(t.decode_tokens) == 1 or f"({t.num_tokens} tokens)" in line, where
            assert "no admission" not in line


def test_a_stalled_request_is_named():
    """A running request that computed nothing (the budget went to those ranked above it) gets a sentence."""
    from minfer.plan import NotAdmitted
    from minfer.trace import StepTrace
    from minfer.viz import sentences

    t = StepTrace(step=3, start_time=0.0, duration=0.1, prefill_tokens={}, decode_tokens={"a": 1},
                  positions={"a": 40}, blocks={"a": 3, "b": 2}, num_running=2, num_waiting=1, num_pending=0,
                  num_free_blocks=0, num_blocks=5, decisions=[NotAdmitted("c", "no_free_blocks", need=2, have=0)])
    told = [(s.kind, s.request, s.why) for s in sentences(t)]
    assert told[0] == ("stalled", "b", "holds 2 blocks but got no budget: the requests ranked above it spent it")
    assert told[1][:2] == ("kept waiting", "c") and "more wait" not in told[1][2]


# ---- exports and the browser side ----------------------------------------------------------------
def read_exported_frames(path) -> list[dict]:
    """The frames inside an exported HTML file (gzipped JSON, base64, in a script tag)."""
    import base64
    import gzip
    import json
    import re

    page = path.read_text()
    packed = re.search(r'id="minfer-frames">([^<]*)</script>', page).group(1)
    return json.loads(gzip.decompress(base64.b64decode(packed)))


def test_html_export_holds_every_step_offline(pressured, tmp_path):
    from minfer.viz import export_html
    from minfer.viz.widget import plotly_js

    _, rec = pressured
    path = export_html(rec, tmp_path / "run.html", progress=False)
    page = path.read_text()
    assert plotly_js()[:2000] in page, "plotly.js is inside the file: no network needed"
    assert "https://" not in page.replace(plotly_js(), ""), "nothing else is fetched either"
    frames = read_exported_frames(path)
    assert [f["step_number"] for f in frames] == [t.step for t in rec.trace]
    k = max(range(len(rec)), key=lambda i: rec.snapshots[i].num_used)
    assert len(frames[k]["views"]["grid"]["data"][1]["x"]) == rec.snapshots[k].num_used
    part = export_html(rec, tmp_path / "part.html", steps=range(2, 6), start=3, progress=False)
    assert [f["step"] for f in read_exported_frames(part)] == [2, 3, 4, 5] and 'data-start="1"' in part.read_text()
    with pytest.raises(ValueError, match="steps"):
        export_html(rec, tmp_path / "bad.html", steps=range(len(rec), len(rec) + 2))


def test_dashboard_exports_what_it_shows(tiny, tmp_path):
    import base64

    engine = tiny_engine(tiny)
    add_requests(engine)
    dash = Dashboard(engine, export_dir=tmp_path)
    with pytest.raises(ValueError, match="nothing to export"):
        dash.export_html()
    dash.run()
    dash.draw(4)
    path = dash.export_html()
    assert path == tmp_path / "minfer-dashboard.html" and "open it in any browser" in dash.message.value
    assert 'data-start="4"' in path.read_text(), "the file opens at the step on screen"
    sent = []
    dash.view.send = lambda content, buffers=None: sent.append(content)  # no browser here: catch the request
    dash.export_png()
    assert sent == [{"command": "png", "filename": "minfer-step-4.png", "download": True}]
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n fake").decode()
    dash.view._handle(None, {"event": "png", "filename": "minfer-step-4.png", "data": png}, [])  # the reply
    assert dash.last_png == tmp_path / "minfer-step-4.png" and dash.last_png.read_bytes().startswith(b"\x89PNG")
    dash.view._handle(None, {"event": "png", "error": "no view of this dashboard is on the page"}, [])
    assert "no PNG" in dash.message.value


def test_plotly_js_is_sent_once_per_kernel(tiny):
    """Each plotly FigureWidget carried its own ~5 MB of JavaScript; a reload had to load ~20 of them. Now
    one library model holds plotly.js and every dashboard's own code is a few kilobytes."""
    from minfer.viz.widget import plotly_library

    engine = tiny_engine(tiny)
    a, b = Dashboard(engine), Dashboard(recording=Recording())
    assert plotly_library() is plotly_library() and len(plotly_library().source) > 3_000_000
    for dash in (a, b):
        assert len(dash.view._esm) < 30_000 and "Plotly.react" in dash.view._esm
        assert not [w for w in dash.widget.children if "FigureWidget" in type(w).__name__]


def test_viz_reads_only_public_engine_data():
    """Issue 12: widgets see StepTrace, PoolSnapshot and the public engine API -- never scheduler or pool
    internals (so the engine can change its insides without breaking a lecture)."""
    import re
    from pathlib import Path

    import minfer.viz

    for path in Path(minfer.viz.__file__).parent.glob("*.py"):
        code = path.read_text()
        assert not re.search(r"\.scheduler\b", code), f"{path.name} reads the scheduler"
        assert not re.search(r"block_pool\.(?!snapshot\(|num_blocks\b)", code), f"{path.name} reads pool internals"


def key_paths(obj, prefix: str = "") -> set[str]:
    if isinstance(obj, dict):
        return {p for k, v in obj.items() for p in key_paths(v, f"{prefix}.{k}")} | {prefix}
    if isinstance(obj, (list, tuple)) and obj and isinstance(obj[0], dict):
        return {p for i, v in enumerate(obj) for p in key_paths(v, f"{prefix}[{i}]")}
    return {prefix}


def test_frames_are_plain_plotly_json(pressured):
    """The browser gets the JSON as built, with no plotly.py in between: every key must be plotly.js's own
    (``line_shape`` is plotly.py shorthand that plotly.js ignores: validation would nest it as ``line.shape``)."""
    import json

    import plotly.graph_objects as go

    from minfer.viz import style
    from minfer.viz.frame import FrameOptions, dashboard_frame

    _, rec = pressured
    frame = dashboard_frame(rec, len(rec) // 2, style.ColorMap(), FrameOptions())
    json.dumps(frame)  # and it is JSON
    for name, spec in frame["views"].items():
        validated = go.Figure(spec).to_plotly_json()
        assert key_paths(spec["data"]) == key_paths(validated["data"]), name


def test_narration_and_rows_use_the_recorded_reasons_tenants_and_priorities(pressured):
    from dataclasses import replace

    from minfer.viz import explain, narrate
    from minfer.viz.frame import FrameOptions, dashboard_frame

    engine, rec = pressured
    k = next(i for i, t in enumerate(rec.trace) if t.preempted)
    victim = rec.trace[k].preempted[0]
    decision = next(d for d in rec.trace[k].decisions if d.request == victim and d.kind == "preempted")
    assert decision.cause == "pool_full" and decision.victim_rule == "the most recently admitted running request"
    why = explain(decision)
    assert why.startswith("pool full:") and "the most recently admitted running request" in why
    trace = list(rec.trace)
    trace[0] = replace(rec.trace[0], tenants={"r0": "alice", "r1": "bob"}, priorities={"r1": 2})
    assert f"preempted {victim} ({why})" in narrate(trace[k])
    fig = timeline_chart(trace, request_metrics(engine))
    assert {"r0 · alice", "r1 · bob · priority 2", "r2"} <= set(fig.layout.yaxis.categoryarray)
    frame = dashboard_frame(Recording(trace=trace, snapshots=rec.snapshots, metrics=rec.metrics), k,
                            ColorMap(), FrameOptions())
    assert "r1 · bob · priority 2" in frame["legend"] and why in plain_text(frame["narration"])


def test_check_figure_needs_no_title_on_an_axis_of_labels():
    from minfer.viz import style

    labelled = style.figure([{"type": "bar", "x": ["reference", "kernel"], "y": [3.0, 1.0]}],
                            {"yaxis": {"title": {"text": "MB moved"}}})
    assert style.check_figure(labelled) == []
    boxes = style.figure([{"type": "box", "y": [1.0, 2.0], "name": "client"}], {"yaxis": {"title": {"text": "ms"}}})
    assert style.check_figure(boxes) == []
    numbers = style.figure([{"type": "bar", "x": [1, 2], "y": [3.0, 1.0]}], {"yaxis": {"title": {"text": "MB"}}})
    assert style.check_figure(numbers) == ["xaxis has no title (say what is counted, with units)"]


def test_run_on_a_finished_run_replays_it_from_the_slider(tiny):
    """Run (``start``/``play``) always acts: once the engine has finished it replays the recording from the
    slider's step -- from the start when the slider is at the end -- and says so; the engine is not stepped."""
    import asyncio

    engine = tiny_engine(tiny)
    add_requests(engine, n=3)
    dash = Dashboard(engine, refresh_interval=0.0)
    rec = dash.run()
    steps = len(rec)
    dash.slider.value = 2  # scrubbed back
    shown = []
    send = dash.view.show
    dash.view.show = lambda frame: (shown.append((frame["step"], frame["status"], dash.message.value)),
                                    send(frame))[1]
    asyncio.run(dash.play())
    assert len(dash.recording) == steps, "a replay: the finished engine took no step"
    assert [i for i, *_ in shown][0] == 3 and dash.index == steps - 1, shown
    assert f"replaying the recording from step {rec.trace[2].step}: the engine has finished" in shown[0][2]
    assert "replaying at full speed (the engine has finished)" in shown[0][1], "the status line says it too"
    assert dash.message.value == "", "the note goes when the replay ends"
    shown.clear()
    asyncio.run(dash.play(max_steps=2))  # Run at the end starts the replay over
    assert dash.index == 1 and f"from step {rec.trace[0].step}" in shown[0][2]


def test_controls_that_cannot_act_say_why(tiny):
    engine = tiny_engine(tiny)
    add_requests(engine, n=2)
    dash = Dashboard(engine)
    dash.back()
    assert "no steps yet" in dash.message.value
    dash._on_pause()  # the Pause button with nothing running
    assert "nothing is running" in dash.message.value
    dash.run()
    last = dash.index
    dash.step()  # the Step button at the end of a finished run
    assert dash.index == last and "the run has finished: no step left" in dash.message.value
    dash.run()  # run() in a cell, on a finished engine
    assert "the engine has finished: nothing left to run" in dash.message.value and dash.index == last
    dash.slider.value = 0
    dash.back()
    assert dash.index == 0 and "the first step" in dash.message.value
    dash.step()
    assert dash.index == 1 and dash.message.value == "", "a control that acts clears the last refusal"
    replayed = Dashboard(recording=dash.recording)
    replayed.step()
    assert "the recording ends here: no step left" in replayed.message.value
    empty = Dashboard(recording=Recording())
    empty.start()
    assert "nothing to run" in empty.message.value and not empty.running


def test_lecture_layout_sets_smaller_views_and_switches_live(tiny):
    engine = tiny_engine(tiny)
    add_requests(engine)
    with pytest.raises(ValueError, match=r"layout must be one of \['notebook', 'lecture'\]"):
        Dashboard(engine, layout="slides")
    dash = Dashboard(engine)
    dash.run()
    tall = {n: v["layout"]["height"] for n, v in dash.view.frame["views"].items()}
    assert dash.view.frame["layout"] == "notebook" and "minfer-notebook" in dash.widget._dom_classes
    dash.layout_button.value = True  # the lecture button
    frame = dash.view.frame
    short = {n: v["layout"]["height"] for n, v in frame["views"].items()}
    assert dash.layout == frame["layout"] == "lecture" and "minfer-lecture" in dash.widget._dom_classes
    assert "minfer-notebook" not in dash.widget._dom_classes
    assert all(short[n] < tall[n] for n in ("batch", "queues", "latency")), (short, tall)
    assert frame["views"]["grid"]["layout"]["meta"]["max_height"] == 190
    assert "<br>" in frame["views"]["grid"]["layout"]["title"]["subtitle"]["text"], "a third of the width"
    dash.font.value = 2.0  # at 2x a lecture view grows as much as its font: its axis titles still fit
    assert dash.view.frame["views"]["batch"]["layout"]["height"] == 2 * short["batch"]
    dash.layout = "notebook"
    assert not dash.layout_button.value and dash.view.frame["layout"] == "notebook"
