"""The scheduler dashboard: every view over one recording, live while the engine runs, or replayed.

    dash = Dashboard()             # knobs and a scenario picker; it builds (and rebuilds) its own engine
    dash = live(engine)            # watch an engine you built; dash.run() steps it to the end
    dash = replay("run.jsonl")     # scrub a run recorded earlier (on a GPU, say) step by step

**Live updates.** Redrawing five figures costs about as much as a step of the small model, and a
browser flooded with updates falls behind. So while running, the views are redrawn at most every
``refresh_interval`` seconds (each view in one batched plotly message), and once more when the run
stops -- the last frame is always exact.

**Run, Pause, Step.** ``dash.run()`` steps in the calling cell (what a notebook runs top to bottom).
The Run button instead steps inside an asyncio task that yields to the kernel after every step, so the
kernel still hears the Pause button and the step slider while the engine runs.
"""

from __future__ import annotations

import asyncio
import html
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import ipywidgets as W
import plotly.graph_objects as go

from minfer.config import POLICIES, EngineConfig
from minfer.engine import LLMEngine
from minfer.request import RequestMetrics
from minfer.viz.batch import batch_chart, timeline_chart, update_batch_chart, update_timeline_chart
from minfer.viz.blocks import block_grid, update_block_grid
from minfer.viz.latency import latency_chart, update_latency_chart
from minfer.viz.queues import queue_chart, update_queue_chart
from minfer.viz.recorder import Recorder, Recording
from minfer.viz.scenarios import SCENARIOS, scenario
from minfer.viz.style import ColorMap

SIM_TIME_SCALE = 0.05  # a simulated GPU step is ~20x shorter than a CPU step of the small real model


@dataclass(slots=True)
class Knobs:
    """What the dashboard's controls set: the engine's main knobs, the scenario, real model or simulator."""

    backend: str = "model"  # "model" (real forward passes) or "sim" (a simulated GPU)
    scenario: str = "mixed chat (6 at once)"
    num_blocks: int = 48
    block_size: int = 16
    chunked_prefill_size: int = 64
    max_num_seqs: int = 8
    policy: str = "fcfs"
    enable_prefix_caching: bool = False
    seed: int = 0
    device: str = "cpu"  # the real model's device ("cuda": the dashboard shows GPU memory beside the pool)

    def engine_config(self, model: str, sim_model: str, hardware: str) -> EngineConfig:
        common = dict(num_blocks=self.num_blocks, block_size=self.block_size, max_num_seqs=self.max_num_seqs,
                      chunked_prefill_size=self.chunked_prefill_size, policy=self.policy,
                      enable_prefix_caching=self.enable_prefix_caching, seed=self.seed)
        if self.backend == "sim":
            return EngineConfig(model=sim_model, executor="sim", hardware=hardware, **common)
        if self.backend != "model":
            raise ValueError(f"backend must be 'model' or 'sim', got {self.backend!r}")
        return EngineConfig(model=model, device=self.device, **common)


def request_metrics(engine: LLMEngine) -> dict[str, RequestMetrics]:
    """Every request's metrics: finished ones and those still queued or running."""
    out = {r.request_id: r.metrics for r in engine.finished}
    out.update({rid: r.metrics for rid, r in engine.scheduler.requests.items()})
    return out


def gpu_memory_text(engine: LLMEngine | None) -> str:
    """Real GPU memory beside the pool (CUDA only; empty otherwise): what the KV pool takes of it."""
    if engine is None or engine.config.executor != "model" or not engine.config.device.startswith("cuda"):
        return ""
    import torch

    dev, gib = engine.config.device, 2**30
    total = torch.cuda.get_device_properties(dev).total_memory
    kv = engine.kv_cache.nbytes
    return (f"<b>GPU memory</b> ({html.escape(torch.cuda.get_device_name(dev))}): "
            f"{torch.cuda.memory_allocated(dev) / gib:.2f} GiB allocated, "
            f"{torch.cuda.memory_reserved(dev) / gib:.2f} GiB reserved of {total / gib:.1f} GiB; "
            f"the KV pool holds {kv / gib:.2f} GiB ({engine.block_pool.num_blocks} blocks × "
            f"{kv // engine.block_pool.num_blocks / 2**20:.2f} MiB)")


class Dashboard:
    """Controls and the five views (tokens per step, timeline, block grid, queues, latency).

    Build it with an ``engine`` to watch (``live``), a ``recording`` to replay, or neither: then it builds
    its own engine from ``knobs`` (real ``model``, or ``sim_model`` on ``hardware`` in the simulator) and
    shows the knobs as controls; "Apply & reset" rebuilds the engine with the scenario's requests.
    """

    def __init__(self, engine: LLMEngine | None = None, recording: Recording | None = None, *,
                 knobs: Knobs | None = None, model: str = "smollm2-135m", sim_model: str = "llama-3-8b",
                 hardware: str = "H100-SXM", weights: tuple[Any, Any] | None = None,
                 ttft_slo: float | None = None, itl_slo: float | None = None, window: int | None = 200,
                 refresh_interval: float = 0.2) -> None:
        if engine is not None and recording is not None:
            raise ValueError("pass an engine to watch or a recording to replay, not both")
        self.knobs = knobs or Knobs()
        self.model_name, self.sim_model, self.hardware = model, sim_model, hardware
        self._weights = weights  # (model, tokenizer), loaded once and reused by every reset
        self.ttft_slo, self.itl_slo = ttft_slo, itl_slo
        self.window, self.refresh_interval = window, refresh_interval
        self.colors = ColorMap()
        self._last_draw = 0.0
        self._following = False  # the code, not the user, is moving the slider
        self._task: asyncio.Future | None = None
        self._run_id = 0  # a background run continues only while this is still its own id
        self.owns_engine = engine is None and recording is None
        if recording is not None:
            self.recorder, self.recording = None, recording
        else:
            self.recorder = Recorder(engine or self._build_engine(self.knobs))
            self.recording = self.recorder.recording
        self._build_widgets()
        self.draw()

    # ---- the engine --------------------------------------------------------------------------------
    @property
    def engine(self) -> LLMEngine | None:
        return self.recorder.engine if self.recorder else None

    def _build_engine(self, k: Knobs) -> LLMEngine:
        from minfer.workload import submit

        cfg = k.engine_config(self.model_name, self.sim_model, self.hardware)
        if k.backend == "sim":
            engine = LLMEngine(cfg)
        else:
            if self._weights is None:
                from minfer.model.loader import load_model

                self._weights = load_model(self.model_name)
            engine = LLMEngine(cfg, model=self._weights[0], tokenizer=self._weights[1])
        scale = SIM_TIME_SCALE if k.backend == "sim" else 1.0
        submit(engine, scenario(k.scenario, k.seed, scale))
        return engine

    def reset(self, **knobs: Any) -> None:
        """Rebuild the engine (with ``knobs`` changed, if given) and start the scenario over. A bad knob
        raises ``ValueError`` and leaves the dashboard as it was."""
        if not self.owns_engine:
            raise ValueError("this dashboard watches an engine (or a recording) it did not build")
        unknown = set(knobs) - set(asdict(self.knobs))
        if unknown:
            raise ValueError(f"unknown knob(s) {sorted(unknown)}; knobs are {list(asdict(self.knobs))}")
        new = replace(self.knobs, **knobs)
        engine = self._build_engine(new)  # may raise: then nothing has changed
        self.pause()
        self.knobs = new
        self.recorder = Recorder(engine)
        self.recording = self.recorder.recording
        self.colors = ColorMap()
        self._sync_controls()
        self.draw()

    # ---- stepping ------------------------------------------------------------------------------------
    def step(self) -> None:
        """One engine step, drawn exactly."""
        if self.recorder and not self.recorder.done():
            self.recorder.step()
        self.draw()

    def run(self, max_steps: int | None = None) -> Recording:
        """Step to the end (or ``max_steps`` steps) in this cell, redrawing at most every
        ``refresh_interval`` seconds, and exactly once more at the end."""
        if self.recorder is None:
            raise ValueError("a replayed recording cannot run; move the step slider instead")
        n = 0
        try:
            while not self.recorder.done() and (max_steps is None or n < max_steps):
                self.recorder.step()
                n += 1
                self._maybe_draw()
        finally:
            self.draw()
        return self.recording

    async def _run_async(self, run_id: int) -> None:
        try:
            while self._run_id == run_id and not self.recorder.done():
                self.recorder.step()
                self._maybe_draw()
                await asyncio.sleep(0)  # let the kernel handle widget messages (Pause, the slider)
        finally:
            self.draw()

    def start(self) -> None:
        """Run in the background (the Run button): the notebook stays responsive."""
        if self.recorder is None:
            return
        self._run_id += 1  # a run still in flight stops at its next step
        self._task = asyncio.ensure_future(self._run_async(self._run_id))

    def pause(self) -> None:
        self._run_id += 1

    # ---- drawing -------------------------------------------------------------------------------------
    def _maybe_draw(self) -> None:
        if time.monotonic() - self._last_draw >= self.refresh_interval:
            self.draw()

    def draw(self, index: int | None = None) -> None:
        """Show the state after step ``index`` of the recording (default: the latest)."""
        rec = self.recording
        last = len(rec) - 1
        index = last if index is None else max(0, min(index, last))
        if self.recorder:
            self.recorder.sync_metrics()
        trace = rec.trace[: index + 1]
        shown = trace[-self.window:] if self.window else trace
        update_batch_chart(self.batch_fig, shown, self.colors)
        update_timeline_chart(self.timeline_fig, trace, rec.metrics, since=shown[0].step if shown else None)
        update_queue_chart(self.queue_fig, trace)
        update_latency_chart(self.latency_fig, rec.metrics, self.ttft_slo, self.itl_slo,
                             until=trace[-1].end_time if trace else None)
        kept = rec.snapshot_at(index)
        title = None
        if kept is not None and kept[0] != index:
            title = f"KV blocks after step {rec.trace[kept[0]].step} (no snapshot kept for this step)"
        update_block_grid(self.grid_fig, kept[1] if kept else None, self.colors, title=title)
        self._following = True
        self.slider.max = max(last, 0)
        self.slider.value = max(index, 0)
        self._following = False
        self.status.value = self._status_text(index)
        self.gpu.value = self._gpu_text(index)
        self._last_draw = time.monotonic()

    def _gpu_text(self, index: int) -> str:
        """Live on CUDA: the device's memory now. Replaying a CUDA run: what was allocated after the step."""
        if self.engine is not None:
            return gpu_memory_text(self.engine)
        mem = self.recording.gpu_memory[index] if 0 <= index < len(self.recording.gpu_memory) else None
        return "" if mem is None else f"<b>GPU memory</b> allocated after this step: {mem / 2**30:.2f} GiB"

    def _status_text(self, index: int) -> str:
        rec = self.recording
        if not rec.trace:
            return "no steps yet: press <b>Step</b> or <b>Run</b>"
        t = rec.trace[index]
        preempted = sum(len(s.preempted) for s in rec.trace[: index + 1])
        finished = sum(len(s.finished) for s in rec.trace[: index + 1])
        used = t.num_blocks - t.num_free_blocks
        return (f"step <b>{t.step}</b> of {rec.trace[-1].step} · engine clock {t.end_time:.3f} s · "
                f"batch {t.batch_size} ({t.num_prefill_tokens} prefill + {t.num_decode_tokens} decode tokens)"
                f" · running {t.num_running} · waiting {t.num_waiting} · finished {finished} · "
                f"preemptions {preempted} · blocks {used}/{t.num_blocks}")

    # ---- widgets -------------------------------------------------------------------------------------
    def _build_widgets(self) -> None:
        empty: list = []
        self.controls: dict[str, W.ValueWidget] = {}  # the knobs, when this dashboard builds its engine
        wide = 920  # fits a notebook in a 1400-pixel window beside JupyterLab's file browser
        self.batch_fig = batch_chart(empty, self.colors, widget=True, width=wide)
        self.timeline_fig = timeline_chart(empty, widget=True, width=wide)
        self.grid_fig = block_grid(None, self.colors, widget=True, width=440)
        self.queue_fig = queue_chart(empty, widget=True, width=480)
        self.latency_fig = latency_chart(empty, self.ttft_slo, self.itl_slo, widget=True, width=wide)

        self.slider = W.IntSlider(0, 0, 0, description="step", continuous_update=False,
                                  layout=W.Layout(width="420px"))
        self.slider.observe(self._on_slider, "value")
        self.status = W.HTML()
        self.gpu = W.HTML()
        buttons = []
        if self.recorder is not None:
            size = W.Layout(width="80px")
            run = W.Button(description="Run", icon="play", button_style="success", layout=size)
            pause = W.Button(description="Pause", icon="pause", layout=size)
            one = W.Button(description="Step", icon="step-forward", layout=size)
            run.on_click(lambda _: self.start())
            pause.on_click(lambda _: self.pause())
            one.on_click(lambda _: self.step())
            buttons = [run, pause, one]
        rows: list[W.Widget] = []
        if self.owns_engine:
            rows.append(self._build_knobs())
        rows += [W.HBox([*buttons, self.slider]), self.status,
                 _boxed(self.batch_fig, "minfer-batch-chart"), _boxed(self.timeline_fig, "minfer-timeline"),
                 W.HBox([W.VBox([_boxed(self.grid_fig, "minfer-block-grid"), self.gpu]),
                         _boxed(self.queue_fig, "minfer-queues")], layout=W.Layout(flex_flow="row wrap")),
                 _boxed(self.latency_fig, "minfer-latency")]
        self.widget = W.VBox(rows)
        self.widget.add_class("minfer-dashboard")

    def _build_knobs(self) -> W.Widget:
        k = self.knobs
        small = dict(style={"description_width": "initial"}, layout=W.Layout(width="140px"))
        self.controls = {
            "backend": W.ToggleButtons(options=[("real model", "model"), ("simulator", "sim")],
                                       value=k.backend, style={"button_width": "90px"}),
            "scenario": W.Dropdown(options=list(SCENARIOS), value=k.scenario, description="scenario",
                                   style={"description_width": "initial"}),
            "num_blocks": W.BoundedIntText(k.num_blocks, min=4, max=4096, description="KV blocks", **small),
            "chunked_prefill_size": W.BoundedIntText(k.chunked_prefill_size, min=1, max=8192,
                                                     description="chunk", **small),
            "max_num_seqs": W.BoundedIntText(k.max_num_seqs, min=1, max=256, description="max seqs", **small),
            "policy": W.Dropdown(options=list(POLICIES), value=k.policy, description="policy", **small),
            "enable_prefix_caching": W.Checkbox(k.enable_prefix_caching, description="prefix caching",
                                                indent=False, layout=W.Layout(width="130px")),
        }
        apply = W.Button(description="Apply & reset", icon="refresh", button_style="warning")
        apply.on_click(self._apply)
        c = self.controls
        return W.VBox([W.HBox([c["backend"], c["scenario"]]),
                       W.HBox([c["num_blocks"], c["chunked_prefill_size"], c["max_num_seqs"], c["policy"],
                               c["enable_prefix_caching"], apply])])

    def _apply(self, _: Any = None) -> None:
        """The Apply button: a knob the engine refuses is reported in the status line, not lost in a log."""
        try:
            self.reset(**{n: c.value for n, c in self.controls.items()})
        except ValueError as e:
            self.status.value = f"<span style='color:#c1121f'>not applied: {html.escape(str(e))}</span>"

    def _sync_controls(self) -> None:
        for name, control in self.controls.items():
            control.value = getattr(self.knobs, name)

    def _on_slider(self, change: dict) -> None:
        if not self._following:
            self.draw(change["new"])

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def _boxed(fig: go.FigureWidget, css_class: str) -> W.Box:
    """A figure in a box with a CSS class, so a browser test can find each view. The box keeps the
    figure's size: never squeezed (and clipped) by its neighbours."""
    box = W.Box([fig], layout=W.Layout(flex="0 0 auto"))
    box.add_class(css_class)
    return box


def live(engine: LLMEngine, **kwargs: Any) -> Dashboard:
    """A dashboard on an engine you built and loaded with requests; call ``.run()`` (or press Run)."""
    from IPython.display import display

    dash = Dashboard(engine, **kwargs)
    display(dash)
    return dash


def replay(source: Recording | str | Path, **kwargs: Any) -> Dashboard:
    """A dashboard over a recorded run (a ``Recording`` or a file from ``Recording.save``/``save_trace``)."""
    from IPython.display import display

    rec = source if isinstance(source, Recording) else Recording.load(source)
    dash = Dashboard(recording=rec, **kwargs)
    display(dash)
    return dash
