"""A recorded run: everything needed to replay an engine's run elsewhere and to score the replay, in one JSON file.

A simulator is judged by how well it reproduces runs it did not make. For that a run must be kept whole: the
engine's configuration (so the replay schedules under the same limits), the model's shape and dtype (so the cost
model prices the same steps), each step's ``StepTrace`` (its shape and measured duration), and each request as it
arrived and was served -- arrival time, prompt, how many tokens it produced, when its first token came, when every
later token came, when it finished. The request timings are what latency percentiles are computed from; the steps
are what a per-step error is computed from.

    engine.run()
    save_run(engine, "run.json")         # a real engine or a simulated one: the same file
    run = load_run("run.json")           # RunRecord: run.requests, run.steps, run.engine ...
    summarize(run.requests)              # the same metrics code as for live requests

Times are on the engine's clock (``engine.now``), which advances by each step's measured (or modelled) duration
and jumps over idle gaps to the next arrival -- so a run replays on any machine without its wall clock. The file
says what it is (``format``) and which layout it uses (``version``); loading refuses another format or a newer
layout, and ignores fields it does not know.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from minfer.config import EngineConfig
from minfer.model.config import ModelConfig
from minfer.request import Request, RequestMetrics
from minfer.sim.hardware import HardwareSpec
from minfer.sim.models import ModelSpec, get_model_spec
from minfer.trace import StepTrace

RUN_FORMAT = "minfer-run"
RUN_VERSION = 1  # the layout of the file: raise it when a field changes meaning, and keep loading the old one


@dataclass(slots=True)
class RequestRecord:
    """One request of a run: what it asked for and when each of its tokens came (engine clock, seconds).

    Read by ``minfer.metrics.summarize`` as it reads a live ``Request`` (``metrics``, ``finish_reason``, the
    token counts), so a recorded run is measured by the very code that measured it live."""

    request_id: str
    arrival_time: float
    prompt_token_ids: list[int]
    num_output_tokens: int  # tokens it produced
    max_tokens: int  # what it asked for
    ignore_eos: bool
    finish_reason: str | None
    first_scheduled_time: float | None
    first_token_time: float | None
    token_times: list[float]  # one per output token: when it existed
    finished_time: float | None
    num_preemptions: int = 0
    num_cached_tokens: int = 0
    priority: int = 0
    tenant: str | None = None

    @classmethod
    def of(cls, req: Request) -> RequestRecord:
        m = req.metrics
        return cls(req.request_id, req.arrival_time, list(req.prompt_token_ids), req.num_output_tokens,
                   req.params.max_tokens, req.params.ignore_eos, req.finish_reason, m.first_scheduled_time,
                   m.first_token_time, list(m.token_times), m.finished_time, m.num_preemptions, m.num_cached_tokens,
                   req.priority, req.tenant)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def metrics(self) -> RequestMetrics:
        """The timings as the metrics code reads them (TTFT, ITL, TPOT, e2e derive from these)."""
        return RequestMetrics(self.arrival_time, self.first_scheduled_time, self.first_token_time,
                              list(self.token_times), self.finished_time, self.num_preemptions,
                              self.num_cached_tokens)


@dataclass(slots=True)
class RunRecord:
    """A whole run. ``engine``: the ``EngineConfig`` fields as plain values (the model and hardware by name);
    ``model``: the model's shape (a ``ModelConfig`` as a dict) -- all the cost model needs of it; ``hardware``: the
    simulator's spec when the simulator made the run, None for a real run (then ``device`` says where it ran)."""

    executor: str  # "model" (real forward passes) or "sim"
    model_name: str
    model: dict[str, Any]
    dtype: str  # the dtype the steps ran in (float32 on a CPU)
    device: str
    hardware: dict[str, Any] | None
    engine: dict[str, Any]
    requests: list[RequestRecord]
    steps: list[StepTrace]
    note: str = ""  # free text: what the run was (a workload, a rate)
    version: int = RUN_VERSION
    format: str = field(default=RUN_FORMAT)

    @classmethod
    def of(cls, engine: Any, note: str = "") -> RunRecord:
        """The run an ``LLMEngine`` has finished: every request it served and every step it took.

        It refuses a run it cannot keep whole -- unfinished requests, or a trace or finished list cut short by
        ``trace_window`` / ``finished_window`` (a replay would miss steps or requests)."""
        config: EngineConfig = engine.config
        if engine.has_unfinished_requests():
            raise ValueError("the engine has unfinished requests: run it to the end before saving the run")
        if not config.record_trace or config.trace_window is not None or config.finished_window is not None:
            raise ValueError("a run is saved whole: record_trace=True, trace_window=None and finished_window=None")
        if not engine.trace:
            raise ValueError("the engine has taken no step: nothing to save")
        if config.executor == "sim":
            cost = engine.executor.cost
            spec, dtype, hardware = cost.model, cost.dtype, _plain(cost.hardware)
        else:
            name = config.model if isinstance(config.model, str) else config.model.name
            spec = ModelSpec(name, engine.model.config)
            dtype, hardware = str(next(engine.model.parameters()).dtype).removeprefix("torch."), None
        return cls(config.executor, spec.name, _plain(spec.config), dtype, config.device, hardware,
                   engine_settings(config), [RequestRecord.of(r) for r in engine.finished], list(engine.trace), note)

    @property
    def model_spec(self) -> ModelSpec:
        """The model as the simulator knows it: a built-in spec when the name is one, else this shape."""
        try:
            known = get_model_spec(self.model_name)
        except ValueError:
            known = None
        config = ModelConfig(**{k: v for k, v in self.model.items() if k in _MODEL_FIELDS})
        config.eos_token_ids = tuple(config.eos_token_ids)
        if known is not None and known.config == config:
            return known
        return ModelSpec(self.model_name, config, "a recorded run")

    @property
    def hardware_spec(self) -> HardwareSpec | None:
        """The simulator's spec that made the run (None for a real run)."""
        if self.hardware is None:
            return None
        return HardwareSpec(**{k: v for k, v in self.hardware.items() if k in _HARDWARE_FIELDS})

    @property
    def num_blocks(self) -> int:
        """KV blocks the run's pool had: a replay gets the same pool."""
        return self.steps[0].num_blocks

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: str | Path) -> RunRecord:
        data = json.loads(Path(path).read_text())
        if data.get("format") != RUN_FORMAT:
            raise ValueError(f"{path} is not a minfer run (format {data.get('format')!r}, expected {RUN_FORMAT!r})")
        if not isinstance(data.get("version"), int) or data["version"] > RUN_VERSION:
            raise ValueError(f"{path} is a run of layout version {data.get('version')!r}; this minfer reads up to "
                             f"{RUN_VERSION}: update minfer")
        known = {k: v for k, v in data.items() if k in _RUN_FIELDS}
        request_fields = {f.name for f in fields(RequestRecord)}
        known["requests"] = [RequestRecord(**{k: v for k, v in r.items() if k in request_fields})
                             for r in data["requests"]]
        known["steps"] = [StepTrace.from_dict(s) for s in data["steps"]]
        return cls(**known)


def engine_settings(config: EngineConfig) -> dict[str, Any]:
    """The configuration as plain values: a model or hardware spec passed as an object is kept by its name (the
    run keeps their contents in ``model`` and ``hardware``)."""
    out = {}
    for f in fields(config):
        value = getattr(config, f.name)
        out[f.name] = value.name if f.name in ("model", "hardware") and value is not None and not isinstance(
            value, str) else _plain(value)
    return out


def save_run(engine: Any, path: str | Path, note: str = "") -> RunRecord:
    """Save the run ``engine`` (an ``LLMEngine``) has finished to ``path`` (JSON); returns the record."""
    record = RunRecord.of(engine, note)
    record.save(path)
    return record


def load_run(path: str | Path) -> RunRecord:
    return RunRecord.load(path)


def _plain(value: Any) -> Any:
    """A value (a dataclass too) as the JSON file will hold it -- tuples as lists -- so that a record equals itself
    read back."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    return json.loads(json.dumps(value))


_RUN_FIELDS = {f.name for f in fields(RunRecord)}
_MODEL_FIELDS = {f.name for f in fields(ModelConfig)}
_HARDWARE_FIELDS = {f.name for f in fields(HardwareSpec)}
