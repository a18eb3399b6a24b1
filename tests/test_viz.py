"""The views hold the numbers of the data they were given: checked on the figure data, no browser."""

from __future__ import annotations

import pytest

from minfer import EngineConfig, LLMEngine, SamplingParams
from minfer.kv.block_pool import BlockPool
from minfer.trace import load_trace, save_trace
from minfer.viz import (
    SCENARIOS,
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
from minfer.viz.style import CACHED_OUTLINE, PLAIN_OUTLINE


def tiny_engine(tiny, **kw) -> LLMEngine:
    cfg = dict(model="tiny-random", block_size=4, num_blocks=16, max_num_seqs=4, chunked_prefill_size=8)
    return LLMEngine(EngineConfig(**(cfg | kw)), model=tiny[0], tokenizer=tiny[1])


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
    decode, prefill = fig.data
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
    decode, prefill = batch_chart(rec.trace).data
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
    assert list(cells.marker.line.color) == [CACHED_OUTLINE if c else PLAIN_OUTLINE for c in snap.cached]
    assert list(labels.text) == ["×2" if snap.ref_counts[b] > 1 else snap.owners()[b][0] for b in used]
    assert "4/12 in use" in fig.layout.title.text and "1 free but cached" in fig.layout.title.text
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


# ---- queues, memory, latency ---------------------------------------------------------------------
def test_queue_chart_holds_the_trace(pressured):
    _, rec = pressured
    fig = queue_chart(rec.trace)
    assert list(fig.data[0].y) == [t.num_waiting for t in rec.trace]
    assert list(fig.data[1].y) == [t.num_running for t in rec.trace]
    assert list(fig.data[3].x) == [t.step for t in rec.trace if t.preempted]
    assert list(fig.data[4].y) == [t.num_blocks - t.num_free_blocks for t in rec.trace]
    assert list(fig.data[6].y) == [16, 16]


def test_latency_chart_holds_the_metrics(pressured):
    engine, rec = pressured
    metrics = request_metrics(engine)
    ttft = sorted(m.ttft for m in metrics.values())
    d = latency_data(metrics)
    assert sorted(d.ttft) == ttft and len(d.itl) == sum(len(m.token_times) - 1 for m in metrics.values())
    slo = ttft[len(ttft) // 2]
    fig = latency_chart(metrics, ttft_slo=slo, itl_slo=0.5)
    assert sorted(fig.data[0].x) == pytest.approx([v * 1e3 for v in ttft])
    assert [s.x0 for s in fig.layout.shapes] == pytest.approx([slo * 1e3, 500])
    share = sum(v <= slo for v in ttft) / len(ttft)
    assert f"{share:.0%} within SLO" in fig.layout.annotations[0].text
    # scrubbed back to step 5: only tokens that existed by then
    until = rec.trace[5].end_time
    early = latency_data(metrics, until=until)
    assert len(early.ttft) == sum(m.first_token_time <= until for m in metrics.values()) < len(ttft)


# ---- recordings on disk --------------------------------------------------------------------------
def test_recording_round_trips_through_a_file(pressured, tmp_path):
    _, rec = pressured
    path = tmp_path / "run.jsonl"
    rec.save(path)
    back = Recording.load(path)
    assert back.trace == rec.trace and back.snapshots == rec.snapshots
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
def test_live_dashboard_throttles_and_ends_exact(tiny, monkeypatch):
    engine = tiny_engine(tiny)
    add_requests(engine)
    dash = Dashboard(engine, refresh_interval=1e9)  # throttle: no redraw while running
    draws = []
    original = Dashboard.draw
    monkeypatch.setattr(Dashboard, "draw", lambda self, i=None: (draws.append(i), original(self, i)))
    rec = dash.run()
    assert draws == [None], "one final exact frame, none in between"
    assert dash.slider.max == len(rec) - 1 == dash.slider.value
    d = batch_data(rec.trace)
    assert list(dash.batch_fig.data[1].y) == d.prefill.tokens
    assert list(dash.batch_fig.data[0].y) == d.decode.tokens
    assert len(dash.grid_fig.data[0].x) == 16 and not dash.grid_fig.data[1].x, "all blocks freed at the end"
    assert f"step <b>{rec.trace[-1].step}</b>" in dash.status.value


def test_run_button_steps_in_the_background_until_paused(tiny):
    import asyncio

    engine = tiny_engine(tiny)
    add_requests(engine)
    dash = Dashboard(engine, refresh_interval=0.0)

    async def session() -> None:
        dash.start()  # the Run button: each step yields to the event loop (the kernel's, in Jupyter)
        for _ in range(5):
            await asyncio.sleep(0)
        dash.pause()
        paused_at = len(dash.recording)
        for _ in range(5):
            await asyncio.sleep(0)
        assert 0 < len(dash.recording) == paused_at, "Pause stops the background run"
        dash.start()
        await dash._task
        assert dash.recorder.done() and dash.slider.value == len(dash.recording) - 1

    asyncio.run(session())


def test_dashboard_scrubs_and_replays(pressured, tmp_path):
    _, rec = pressured
    path = tmp_path / "run.jsonl"
    rec.save(path)
    dash = Dashboard(recording=Recording.load(path))
    k = max(range(len(rec)), key=lambda i: rec.snapshots[i].num_used)  # the fullest step
    dash.slider.value = k  # as a user dragging the slider
    snap = rec.snapshots[k]
    assert len(dash.grid_fig.data[1].x) == snap.num_used
    assert list(dash.grid_fig.data[1].y) == pytest.approx(
        [CELL * snap.filled[b] / snap.block_size for b in range(snap.num_blocks) if snap.ref_counts[b]])
    assert list(dash.queue_fig.data[0].y) == [t.num_waiting for t in rec.trace[: k + 1]]
    with pytest.raises(ValueError, match="cannot run"):
        dash.run()


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
    dash._apply()  # the Apply button: 8 blocks cannot hold the 256-token prompt
    assert "not applied" in dash.status.value and "num_blocks" in dash.status.value
    assert dash.engine is engine and dash.knobs.num_blocks == 200, "a refused knob changes nothing"


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
