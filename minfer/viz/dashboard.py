"""The scheduler dashboard: every view over one recording, live while the engine runs, or replayed.

    dash = Dashboard()             # knobs and a scenario picker; it builds (and rebuilds) its own engine
    dash = live(engine)            # watch an engine you built: Run, or `await dash.play()` in a cell
    dash = replay("run.jsonl")     # scrub or Play a run recorded earlier (on a GPU, say) step by step

**What the browser gets.** Each redraw sends one *frame* (``minfer.viz.frame``): the five figures as plotly
JSON, the status line, the narration line, the legend. The widget (``minfer.viz.widget``) keeps only that
frame, so a second view, or every view after a page reload, draws exactly what the first one shows.

**Live updates.** While running flat out, the views are redrawn at most every ``refresh_interval``
seconds, and once more when the run stops -- the last frame is always exact. At a chosen pace (the
*steps/s* control) every step is drawn.

**Run, Play, Pause, Step.** The Run button (Play, for a replay) steps inside an asyncio task that hands
the kernel back after every step (``MIN_YIELD`` at least), so the kernel hears Pause, the slider and the
arrow keys between two steps: Pause stops the run before its next step. ``await dash.play()`` does the
same from a notebook cell (the cell waits, the buttons still work). ``dash.run()`` steps in the calling
code -- what a script or a test wants; in a notebook the kernel cannot hear any button until that cell
ends, so the buttons are greyed out meanwhile rather than looking as if they worked.
"""

from __future__ import annotations

import asyncio
import base64
import html
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import ipywidgets as W

from minfer.config import POLICIES, EngineConfig
from minfer.engine import LLMEngine
from minfer.request import RequestMetrics
from minfer.viz.batch import request_order
from minfer.viz.export import export_html
from minfer.viz.frame import LAYOUTS, FrameOptions, check_layout, dashboard_frame
from minfer.viz.recorder import Recorder, Recording
from minfer.viz.scenarios import SCENARIOS, scenario
from minfer.viz.style import ColorMap
from minfer.viz.widget import DashboardView

SIM_TIME_SCALE = 0.05  # a simulated GPU step is ~20x shorter than a CPU step of the small real model
MIN_YIELD = 0.01  # seconds a background run leaves the kernel after each step, to hear Pause at once
SPEEDS = (("max", 0.0), ("0.5 steps/s", 0.5), ("1 step/s", 1.0), ("2 steps/s", 2.0), ("4 steps/s", 4.0),
          ("10 steps/s", 10.0))


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
        common: dict[str, Any] = dict(
            num_blocks=self.num_blocks, block_size=self.block_size, max_num_seqs=self.max_num_seqs,
            chunked_prefill_size=self.chunked_prefill_size, policy=self.policy,
            enable_prefix_caching=self.enable_prefix_caching, seed=self.seed)
        if self.backend == "sim":
            return EngineConfig(model=sim_model, executor="sim", hardware=hardware, **common)
        if self.backend != "model":
            raise ValueError(f"backend must be 'model' or 'sim', got {self.backend!r}")
        return EngineConfig(model=model, device=self.device, **common)


KNOB_LABELS = {"backend": "backend", "scenario": "scenario", "num_blocks": "KV blocks",
               "chunked_prefill_size": "chunk", "max_num_seqs": "max seqs", "policy": "policy",
               "enable_prefix_caching": "prefix caching"}


def request_metrics(engine: LLMEngine) -> dict[str, RequestMetrics]:
    """Every request's metrics: finished ones and those still queued or running."""
    out = {r.request_id: r.metrics for r in engine.finished}
    out.update({r.request_id: r.metrics for r in engine.unfinished_requests()})
    return out


def gpu_memory_text(engine: LLMEngine | None) -> str:
    """Real GPU memory beside the pool (CUDA only; empty otherwise): what the KV pool takes of it."""
    if engine is None or engine.config.executor != "model" or not engine.config.device.startswith("cuda"):
        return ""
    import torch

    dev, gib = engine.config.device, 2**30
    total = torch.cuda.get_device_properties(dev).total_memory
    kv = engine.kv_cache.nbytes if engine.kv_cache is not None else 0
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
    ``steps_per_second`` paces Run and Play (0: as fast as the engine goes); ``font_scale`` (1-2) sizes
    every text for a lecture hall, the controls' included; ``layout`` is "notebook" (each view as tall as it
    reads best: scroll through them) or "lecture" (every view and the controls on one 1366x768 screen, the
    controls row staying on screen while the notebook scrolls); the *lecture* button switches it live.
    Exports are written to ``export_dir``.
    """

    def __init__(self, engine: LLMEngine | None = None, recording: Recording | None = None, *,
                 knobs: Knobs | None = None, model: str = "smollm2-135m", sim_model: str = "llama-3-8b",
                 hardware: str = "H100-SXM", weights: tuple[Any, Any] | None = None,
                 ttft_slo: float | None = None, itl_slo: float | None = None, window: int | None = 200,
                 refresh_interval: float = 0.2, steps_per_second: float = 0.0, font_scale: float = 1.0,
                 layout: str = "notebook", export_dir: str | Path = ".") -> None:
        if engine is not None and recording is not None:
            raise ValueError("pass an engine to watch or a recording to replay, not both")
        if not 1.0 <= font_scale <= 2.0:
            raise ValueError(f"font_scale must be between 1 and 2, got {font_scale}")
        if steps_per_second < 0:
            raise ValueError(f"steps_per_second must be >= 0 (0: as fast as possible), got {steps_per_second}")
        self.knobs = knobs or Knobs()
        self.model_name, self.sim_model, self.hardware = model, sim_model, hardware
        self._weights = weights  # (model, tokenizer), loaded once and reused by every reset
        self.options = FrameOptions(window=window, ttft_slo=ttft_slo, itl_slo=itl_slo, scale=font_scale,
                                    layout=check_layout(layout))
        self.refresh_interval = refresh_interval
        self.export_dir = Path(export_dir)
        self.colors = ColorMap()
        self.index = -1  # the step on screen (an index into the recording; -1: before the first step)
        self.state = ""  # what the status line says the dashboard is doing ("running, 2 steps/s")
        self._note: tuple[int, str] = (0, "")  # the message a Run / Play began with, and that run's id
        self.last_png: Path | None = None
        self._png_target: Path | None = None
        self._last_draw = 0.0
        self._following = False  # the code, not the user, is moving the slider
        self._task: asyncio.Future | None = None
        self._run_id = 0  # a background run continues only while this is still its own id
        self.owns_engine = engine is None and recording is None
        if recording is not None:
            self.recorder, self.recording = None, recording
            for rid in request_order(recording.trace):  # hues in the run's order, wherever you scrub first
                self.colors(rid)
        else:
            self.recorder = Recorder(engine or self._build_engine(self.knobs))
            self.recording = self.recorder.recording
        self._build_widgets(steps_per_second)
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

    # ---- stepping and playback ----------------------------------------------------------------------
    @property
    def steps_per_second(self) -> float:
        return self.speed.value

    @steps_per_second.setter
    def steps_per_second(self, value: float) -> None:
        self.speed.value = value

    def step(self) -> None:
        """One step forward, drawn exactly: the next recorded step while the slider is behind the newest
        one, else the engine's next step (live). At the end there is none: the message line says so."""
        self.pause()
        if self.index < len(self.recording) - 1:
            self._say("")
            self.draw(self.index + 1)
        elif self.recorder is not None and not self.recorder.done():
            self._say("")
            self.recorder.step()
            self.draw()
        else:
            self._say(self._no_step_left())

    def back(self) -> None:
        """One step back in the recording (the engine never runs backwards: this scrubs)."""
        self.pause()
        if self.index > 0:
            self._say("")
            self.draw(self.index - 1)
        else:
            self._say("no steps yet: nothing to go back to; <b>Step</b> or <b>Run</b> start the run"
                      if self.index < 0 else "this is the first step: nothing before it; <b>Step</b> or "
                      f"<b>{self._run_label}</b> go forward")

    @property
    def finished(self) -> bool:
        """Nothing left to compute: a replay, or a live engine with no request left."""
        return self.recorder is None or self.recorder.done()

    @property
    def _run_label(self) -> str:
        return "Run" if self.recorder is not None else "Play"

    def _no_step_left(self) -> str:
        """Why Step cannot move: the end of a finished run (or of a replay), or nothing recorded at all."""
        if not len(self.recording):
            return ("the engine has no requests: nothing to step (<b>Apply &amp; reset</b> starts the scenario "
                    "again)" if self.recorder is not None else "the recording is empty: nothing to step")
        what = "the run has finished" if self.recorder is not None else "the recording ends here"
        return (f"{what}: no step left; ◀ <b>Back</b> or the slider scrub it, <b>{self._run_label}</b> "
                "replays it")

    def run(self, max_steps: int | None = None) -> Recording:
        """Step to the end (or ``max_steps`` steps) in the calling code, redrawing at most every
        ``refresh_interval`` seconds, and exactly once more at the end. In a notebook, ``await
        dash.play()`` keeps the buttons working while it runs."""
        if self.recorder is None:
            raise ValueError("a replayed recording cannot run; move the step slider or press Play")
        self.pause()
        if self.recorder.done():
            self._say("the engine has finished: nothing left to run (<code>dash.start()</code> or <b>Run</b> "
                      "replay the recording)")
            self.draw()
            return self.recording
        self._blocking(True)
        n = 0
        try:
            while not self.recorder.done() and (max_steps is None or n < max_steps):
                self.recorder.step()
                n += 1
                self._maybe_draw()
        finally:
            self._blocking(False)
            self.draw()
        return self.recording

    async def play(self, max_steps: int | None = None) -> Recording:
        """Run (live) or play (replay) from a notebook cell -- ``await dash.play()`` -- at the chosen
        steps/s, until the end, ``max_steps`` steps, or Pause; returns the recording."""
        self.start(max_steps)
        if self._task is not None:
            await self._task
        return self.recording

    def start(self, max_steps: int | None = None) -> None:
        """The Run / Play button: step in the background; the notebook stays responsive. It always acts:
        live, it steps the engine (first playing the recorded steps ahead of the slider, if it was scrubbed
        back); once the engine has finished -- or on a replay -- it replays the recording from the slider's
        step, from the start if the slider is at the end, and the message line says which."""
        self._run_id += 1  # a run still in flight stops at its next step
        last = len(self.recording) - 1
        if self.finished and last < 0:
            self._say("nothing to run: " + self._no_step_left().split(": ", 1)[1])
            return
        if self.finished and self.index >= last:
            self.index = -1  # at the end of a finished recording: start it over
        self._note = (self._run_id, self._playback_note())  # the run that said it, and what it said
        self._say(self._note[1])
        self._task = asyncio.ensure_future(self._playback(self._run_id, max_steps))

    def _playback_note(self) -> str:
        """What Run / Play is about to do, when it is not simply 'step the engine' (empty: nothing to say)."""
        first = self.recording.trace[max(self.index, 0)].step if len(self.recording) else 0
        if self.recorder is not None and self.recorder.done():
            return f"replaying the recording from step {first}: the engine has finished"
        if self.recorder is not None and self.index < len(self.recording) - 1:
            return f"replaying the recorded steps from step {first}, then running the engine"
        if self.recorder is None and self.index < 0:
            return f"playing the recording from step {first}"
        return ""

    def pause(self) -> None:
        """Stop a background run before its next step."""
        self._run_id += 1

    def _on_pause(self) -> None:
        """The Pause button: with nothing running it cannot act, and says so."""
        if not self.running:
            self._say(f"nothing is running: <b>Pause</b> stops <b>{self._run_label}</b> between two steps")
        self.pause()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def _advance(self) -> bool:
        """One step of playback: the next recorded step while the slider is behind the newest one, else
        the engine's next step (live); False when there is neither."""
        if self.index < len(self.recording) - 1:
            self.index += 1
            return True
        if self.finished:
            return False
        self.recorder.step()  # type: ignore[union-attr]  # not finished: live
        self.index = len(self.recording) - 1
        return True

    def _playing(self, pace: float) -> str:
        """The status line's word for the step about to be shown: the engine runs, or a recording plays."""
        why = ""
        if self.recorder is None:
            verb = "playing"
        elif self.index < len(self.recording) - 1:
            verb, why = "replaying", " (the engine has finished)" if self.recorder.done() else ""
        else:
            verb = "running"
        return f"{verb} at " + (f"{pace:g} steps/s" if pace else "full speed") + why

    async def _playback(self, run_id: int, max_steps: int | None) -> None:
        n = 0
        try:
            while self._run_id == run_id and (max_steps is None or n < max_steps):
                began = time.monotonic()
                pace = self.steps_per_second
                self.state = self._playing(pace)
                if not self._advance():
                    break
                n += 1
                if pace and 1 / pace >= self.refresh_interval:  # paced: every step drawn, and seen
                    await self._until_on_screen(self._send(self.index), run_id)
                else:  # flat out: the engine never waits; a frame goes when the last one is on screen
                    self._maybe_draw(self.index, wait_for_browser=True)
                left = (1 / pace if pace else 0.0) - (time.monotonic() - began)
                await asyncio.sleep(max(left, MIN_YIELD))  # the kernel hears Pause, keys, the slider here
        finally:  # paused, finished or superseded: the last frame is exact, and says it stopped
            self.state = ""
            if self._note == (run_id, self.message.value):
                self._say("")  # "replaying from step N" is over with this run (a newer run's note stays)
            self.draw(self.index)

    async def _until_on_screen(self, serial: int, run_id: int) -> None:
        """Wait until a browser view has drawn frame ``serial`` (no view watching: no wait)."""
        while self.view.watched and not self.view.on_screen(serial) and self._run_id == run_id:
            await asyncio.sleep(MIN_YIELD)

    def _blocking(self, on: bool) -> None:
        """While ``run()`` holds the kernel, grey out what it cannot hear (and say why)."""
        for b in self._play_buttons:
            b.disabled = on
        self.message.value = ("<i>stepping in this cell: the buttons answer when it ends (<code>await "
                              "dash.play()</code> keeps them live)</i>") if on else ""

    # ---- drawing -------------------------------------------------------------------------------------
    def _maybe_draw(self, index: int | None = None, wait_for_browser: bool = False) -> None:
        """Draw step ``index`` (default: the latest) if ``refresh_interval`` has passed -- and, with
        ``wait_for_browser``, if a watching browser has drawn the last frame (a frame it cannot draw yet
        would only queue up)."""
        if time.monotonic() - self._last_draw < self.refresh_interval:
            return
        if wait_for_browser and self.view.watched and not self.view.on_screen(self.view.serial):
            return
        self.draw(index)

    def frame(self, index: int | None = None) -> dict:
        """The picture after step ``index`` (default: the latest), as sent to the browser."""
        rec = self.recording
        index = len(rec) - 1 if index is None else index
        if self.recorder:
            self.recorder.sync_metrics()
        snapshot = self.engine.block_pool.snapshot() if index < 0 and self.engine else None
        extra = self._gpu_text(index)
        return dashboard_frame(rec, index, self.colors, self.options, snapshot, self.state, extra)

    def draw(self, index: int | None = None) -> None:
        """Show the state after step ``index`` of the recording (default: the latest)."""
        self._send(index)

    def _send(self, index: int | None = None) -> int:
        """Draw, and return the frame's serial number (the browser reports it back once on screen)."""
        last = len(self.recording) - 1
        index = last if index is None else max(min(index, last), 0 if last >= 0 else -1)
        self.index = index
        serial = self.view.show(self.frame(index))
        self._following = True
        self.slider.max = max(last, 0)
        self.slider.value = max(index, 0)
        self.slider.disabled = last < 1
        self._following = False
        self._last_draw = time.monotonic()
        return serial

    def _gpu_text(self, index: int) -> str:
        """Live on CUDA: the device's memory now. Replaying a CUDA run: what was allocated after the step."""
        if self.engine is not None:
            return gpu_memory_text(self.engine)
        mem = self.recording.gpu_memory[index] if 0 <= index < len(self.recording.gpu_memory) else None
        return "" if mem is None else f"<b>GPU memory</b> allocated after this step: {mem / 2**30:.2f} GiB"

    # ---- exports -------------------------------------------------------------------------------------
    def export_html(self, path: str | Path | None = None, steps: range | None = None) -> Path:
        """The recording as a standalone HTML file that replays offline (slider, Play, arrow keys)."""
        if not len(self.recording):
            raise ValueError("nothing to export yet: run some steps first")
        path = Path(path) if path else self.export_dir / "minfer-dashboard.html"
        start = self.index if steps is None or self.index in steps else None
        out = export_html(self.recording, path, colors=self.colors, options=self.options, steps=steps, start=start)
        self._say(f"saved <code>{html.escape(str(out))}</code> ({out.stat().st_size / 2**20:.1f} MB): "
                  "open it in any browser, no kernel or network needed")
        return out

    def export_png(self, path: str | Path | None = None) -> None:
        """A PNG of the dashboard on screen, rendered by the browser showing it: downloaded there, and
        saved to ``path`` (default ``export_dir/minfer-step-N.png``) once the image reaches the kernel --
        at once from the button; after the cell ends when called in a cell."""
        step = self.recording.trace[self.index].step if self.index >= 0 else "start"
        target = Path(path) if path else self.export_dir / f"minfer-step-{step}.png"
        self._png_target = target
        self.view.request_png(target.name)
        self._say(f"asked the browser for a PNG of step {step} …")

    def _on_png(self, content: dict) -> None:
        if content.get("error"):
            self._say(f"<span style='color:#c1121f'>no PNG: {html.escape(content['error'])}</span>")
            return
        target = self._png_target or self.export_dir / content.get("filename", "minfer-step.png")
        target.write_bytes(base64.b64decode(content["data"]))
        self.last_png = target
        self._say(f"saved <code>{html.escape(str(target))}</code> (and downloaded it in the browser)")

    def _say(self, text: str) -> None:
        self.message.value = text

    # ---- widgets -------------------------------------------------------------------------------------
    def _build_widgets(self, steps_per_second: float) -> None:
        self.controls: dict[str, W.ValueWidget] = {}  # the knobs, when this dashboard builds its engine
        self.view = DashboardView(on_key=self._on_key, on_png=self._on_png)
        self.view.add_class("minfer-view-widget")
        self.slider = W.IntSlider(0, 0, 0, description="step", continuous_update=False,
                                  layout=W.Layout(width="22em"))  # em: controls grow with the font scale
        self.slider.observe(self._on_slider, "value")
        self.speed = W.Dropdown(options=list(SPEEDS), value=steps_per_second if steps_per_second in dict(
            SPEEDS).values() else 0.0, description="speed", layout=W.Layout(width="13em"),
                                style={"description_width": "initial"})
        if steps_per_second not in dict(SPEEDS).values():  # a pace of your own joins the list
            self.speed.options = [*SPEEDS, (f"{steps_per_second:g} steps/s", steps_per_second)]
            self.speed.value = steps_per_second
        self.font = W.FloatSlider(self.options.scale, min=1.0, max=2.0, step=0.25, description="font",
                                  readout_format=".2f", continuous_update=False, layout=W.Layout(width="14em"),
                                  style={"description_width": "initial"})
        self.font.observe(self._on_font, "value")
        self.message = W.HTML()  # what the last action did, or why it could not act
        self.message.add_class("minfer-message")
        live = self.recorder is not None
        size = W.Layout(width="auto")
        back = W.Button(description="", icon="step-backward", tooltip="previous step (←)", layout=size)
        play = W.Button(description="Run" if live else "Play", icon="play", button_style="success", layout=size,
                        tooltip="step at the chosen speed until the end or Pause")
        pause = W.Button(description="Pause", icon="pause", layout=size, tooltip="stop before the next step")
        forward = W.Button(description="Step" if live else "", icon="step-forward", layout=size,
                           tooltip="one step (→)")
        to_html = W.Button(description="HTML", icon="download", layout=size,
                           tooltip="save the recording as an interactive HTML file that plays offline")
        to_png = W.Button(description="PNG", icon="image", layout=size, tooltip="save a PNG of this step")
        self.layout_button = W.ToggleButton(self.layout == "lecture", description="lecture", icon="desktop",
                                            layout=size, tooltip="lecture layout: every view on one screen, "
                                            "the controls always in sight")
        self.layout_button.observe(self._on_layout, "value")
        back.on_click(lambda _: self.back())
        play.on_click(lambda _: self.start())
        pause.on_click(lambda _: self._on_pause())
        forward.on_click(lambda _: self.step())
        to_html.on_click(lambda _: self._guard(self.export_html))
        to_png.on_click(lambda _: self._guard(self.export_png))
        for b, css in ((play, "minfer-run"), (pause, "minfer-pause"), (forward, "minfer-step"),
                       (back, "minfer-back"), (to_html, "minfer-export-html"), (to_png, "minfer-export-png"),
                       (self.layout_button, "minfer-layout")):
            b.add_class(css)
        self._play_buttons = [back, play, pause, forward]
        rows: list[W.Widget] = []
        if self.owns_engine:
            rows.append(self._build_knobs())
        controls = W.HBox([back, play, pause, forward, self.speed, self.slider, self.font, to_html, to_png,
                           self.layout_button], layout=W.Layout(flex_flow="row wrap", align_items="center"))
        controls.add_class("minfer-controls")  # sticky in the lecture layout (dashboard.css)
        rows += [controls, self.message, self.view]
        self.widget = W.VBox(rows, layout=W.Layout(width="100%"))
        self.widget.add_class("minfer-dashboard")
        self._dress_layout()

    def _guard(self, action: Any) -> None:
        """A button's action: a refusal shows beside the buttons, not in a log nobody sees."""
        try:
            action()
        except ValueError as e:
            self._say(f"<span style='color:#c1121f'>{html.escape(str(e))}</span>")

    def _build_knobs(self) -> W.Widget:
        k = self.knobs
        small = dict(style={"description_width": "initial"}, layout=W.Layout(width="10em"))
        self.controls = {
            "backend": W.ToggleButtons(options=[("real model", "model"), ("simulator", "sim")],
                                       value=k.backend, style={"button_width": "7.5em"}),
            "scenario": W.Dropdown(options=list(SCENARIOS), value=k.scenario, description="scenario",
                                   style={"description_width": "initial"}),
            "num_blocks": W.BoundedIntText(k.num_blocks, min=4, max=4096, description="KV blocks", **small),
            "chunked_prefill_size": W.BoundedIntText(k.chunked_prefill_size, min=1, max=8192,
                                                     description="chunk", **small),
            "max_num_seqs": W.BoundedIntText(k.max_num_seqs, min=1, max=256, description="max seqs", **small),
            "policy": W.Dropdown(options=list(POLICIES), value=k.policy, description="policy", **small),
            "enable_prefix_caching": W.Checkbox(k.enable_prefix_caching, description="prefix caching",
                                                indent=False, layout=W.Layout(width="10em")),
        }
        self.apply_button = W.Button(description="Apply & reset", icon="refresh")
        self.apply_button.on_click(self._apply)
        self.apply_button.add_class("minfer-apply")
        self.pending = W.HTML()
        self.pending.add_class("minfer-pending")
        for control in self.controls.values():
            control.observe(self._show_pending, "value")
        c = self.controls
        return W.VBox([W.HBox([c["backend"], c["scenario"]]),
                       W.HBox([c["num_blocks"], c["chunked_prefill_size"], c["max_num_seqs"], c["policy"],
                               c["enable_prefix_caching"], self.apply_button],
                              layout=W.Layout(flex_flow="row wrap", align_items="center")),
                       self.pending])

    def pending_knobs(self) -> dict[str, tuple[Any, Any]]:
        """Knobs whose control differs from what the engine runs with: name → (shown, applied)."""
        applied = asdict(self.knobs)
        return {n: (c.value, applied[n]) for n, c in self.controls.items() if c.value != applied[n]}

    def _show_pending(self, _: Any = None) -> None:
        """Changed knobs are not applied until Apply & reset: say so, next to the button."""
        diff = self.pending_knobs()
        self.apply_button.button_style = "warning" if diff else ""
        self.apply_button.description = f"Apply & reset ({len(diff)})" if diff else "Apply & reset"
        if not diff:
            self.pending.value = ""
            return
        items = ", ".join(f"{KNOB_LABELS[n]} {html.escape(str(shown))} (running: {html.escape(str(now))})"
                          for n, (shown, now) in diff.items())
        self.pending.value = (f"<div style='background:#fff3cd;padding:2px 8px;border-radius:3px'><b>not applied "
                              f"yet</b>: {items} -- Step and Run continue the current run until you press "
                              "<b>Apply &amp; reset</b></div>")

    def _apply(self, _: Any = None) -> None:
        """The Apply button: a knob the engine refuses is reported beside the buttons, not lost in a log."""
        try:
            self.reset(**{n: c.value for n, c in self.controls.items()})
        except ValueError as e:
            self._say(f"<span style='color:#c1121f'><b>not applied</b>: {html.escape(str(e))}</span>")
        else:
            self._say("")
        self._show_pending()

    def _sync_controls(self) -> None:
        for name, control in self.controls.items():
            control.value = getattr(self.knobs, name)

    def _on_slider(self, change: dict) -> None:
        if not self._following:  # the user scrubs: a run in flight stops, the view follows the slider
            self.pause()
            self.draw(change["new"])

    def _on_font(self, change: dict) -> None:
        self.options.scale = change["new"]
        self.draw(self.index)

    # ---- layout --------------------------------------------------------------------------------------
    @property
    def layout(self) -> str:
        """"notebook" or "lecture" (``minfer.viz.frame.LAYOUTS``); setting it redraws."""
        return self.options.layout

    @layout.setter
    def layout(self, value: str) -> None:
        self.options.layout = check_layout(value)
        self.layout_button.value = value == "lecture"  # (observed: a change lands in _on_layout)
        self._dress_layout()
        self.draw(self.index)

    def _on_layout(self, change: dict) -> None:
        wanted = "lecture" if change["new"] else "notebook"
        if wanted != self.layout:
            self.layout = wanted

    def _dress_layout(self) -> None:
        """The layout's class on the ipywidgets box (the controls' side); the views read it from the frame."""
        for name in LAYOUTS:
            if name == self.layout:
                self.widget.add_class(f"minfer-{name}")
            else:
                self.widget.remove_class(f"minfer-{name}")

    def _on_key(self, key: str) -> None:
        if key == "ArrowLeft":
            self.back()
        elif key == "ArrowRight":
            self.step()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def live(engine: LLMEngine, **kwargs: Any) -> Dashboard:
    """A dashboard on an engine you built and loaded with requests. Press Run, or ``await
    live(engine).play()`` in a cell (``.run()`` in a script)."""
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
