"""Widgets that watch the scheduler think: every view renders ``StepTrace``, ``PoolSnapshot`` and
``RequestMetrics`` data only, through a pure function that tests check without a browser.

Static figures (``go.Figure``, in the course style of ``minfer.viz.style``)::

    block_grid(engine.block_pool.snapshot())     # the KV pool: owners, fill, sharing, cached blocks
    batch_chart(engine.trace)                    # tokens per step per request, prefill vs decode
    timeline_chart(engine.trace, request_metrics(engine))   # Gantt: waiting/prefill/decode/preempted
    queue_chart(engine.trace)                    # queue lengths and KV blocks over steps
    latency_chart(request_metrics(engine), ttft_slo=0.5, itl_slo=0.1)   # TTFT/ITL histograms vs SLOs
    narrate(engine.trace[-1])                    # what the scheduler decided in a step, and why
    explain(engine.trace[-1].decisions[0])       # one decision's why, in words

The dashboard (controls, live updates, replay, exports)::

    Dashboard()                  # knobs + scenario picker, real model or simulator
    await live(engine).play()    # watch an engine you built (or press Run)
    replay("run.jsonl")          # scrub or Play a recording (Recorder(engine).run().save("run.jsonl"))
    export_html(recording, "run.html")   # the dashboard as one offline HTML file, with its slider
"""

from minfer.viz import style
from minfer.viz.batch import (
    batch_chart,
    batch_data,
    batch_figure,
    step_states,
    timeline_chart,
    timeline_data,
    timeline_figure,
)
from minfer.viz.blocks import block_grid, grid_data, grid_figure
from minfer.viz.dashboard import Dashboard, Knobs, live, replay, request_metrics
from minfer.viz.export import export_html
from minfer.viz.frame import FrameOptions, dashboard_frame
from minfer.viz.latency import latency_chart, latency_data, latency_figure
from minfer.viz.narration import Sentence, explain, narrate, sentences
from minfer.viz.queues import queue_chart, queue_data, queue_figure
from minfer.viz.recorder import Recorder, Recording
from minfer.viz.scenarios import SCENARIOS, scenario
from minfer.viz.style import ColorMap

__all__ = ["SCENARIOS", "ColorMap", "Dashboard", "FrameOptions", "Knobs", "Recorder", "Recording", "Sentence",
           "batch_chart", "batch_data", "batch_figure", "block_grid", "dashboard_frame", "explain", "export_html",
           "grid_data", "grid_figure", "latency_chart", "latency_data", "latency_figure", "live", "narrate",
           "queue_chart", "queue_data", "queue_figure", "replay", "request_metrics", "scenario", "sentences",
           "step_states", "style", "timeline_chart", "timeline_data", "timeline_figure"]
