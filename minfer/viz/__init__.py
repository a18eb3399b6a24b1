"""Widgets that watch the scheduler think: every view renders ``StepTrace``, ``PoolSnapshot`` and
``RequestMetrics`` data only, through a pure function that tests check without a browser.

Static figures (``go.Figure``; pass ``widget=True`` for a live ``FigureWidget``)::

    block_grid(engine.block_pool.snapshot())     # the KV pool: owners, fill, sharing, cached blocks
    batch_chart(engine.trace)                    # tokens per step per request, prefill vs decode
    timeline_chart(engine.trace, request_metrics(engine))   # Gantt: waiting/prefill/decode/preempted
    queue_chart(engine.trace)                    # queue lengths and KV blocks over steps
    latency_chart(request_metrics(engine), ttft_slo=0.5, itl_slo=0.1)   # TTFT/ITL histograms vs SLOs

The dashboard (controls, live updates, replay)::

    Dashboard()                  # knobs + scenario picker, real model or simulator
    live(engine).run()           # watch an engine you built
    replay("run.jsonl")          # scrub a recording (Recorder(engine).run().save("run.jsonl"))
"""

from minfer.viz.batch import batch_chart, batch_data, step_states, timeline_chart, timeline_data
from minfer.viz.blocks import block_grid, grid_data
from minfer.viz.dashboard import Dashboard, Knobs, live, replay, request_metrics
from minfer.viz.latency import latency_chart, latency_data
from minfer.viz.queues import queue_chart, queue_data
from minfer.viz.recorder import Recorder, Recording
from minfer.viz.scenarios import SCENARIOS, scenario
from minfer.viz.style import ColorMap

__all__ = ["SCENARIOS", "ColorMap", "Dashboard", "Knobs", "Recorder", "Recording", "batch_chart",
           "batch_data", "block_grid", "grid_data", "latency_chart", "latency_data", "live", "queue_chart",
           "queue_data", "replay", "request_metrics", "scenario", "step_states", "timeline_chart",
           "timeline_data"]
