"""Recorder and Recording: everything the views draw, kept step by step, in memory or in a file.

``engine.trace`` already says who ran in each step and how many blocks each request holds -- but not
*which* blocks. To replay the block grid step by step, the ``Recorder`` steps the engine itself and
takes a ``BlockPool.snapshot()`` after every step. It also keeps each request's ``RequestMetrics``
(arrival and token times: the latency charts and the timeline's "waiting" bars need them) and, on CUDA,
the GPU memory in use.

A ``Recording`` saves as JSON lines, one step per line: the ``StepTrace`` fields, plus ``snapshot``,
``metrics`` (of the requests that finished in that step; the last line also carries the unfinished ones)
and ``gpu_memory``. So ``minfer.trace.load_trace`` reads a recording too, and ``Recording.load`` reads a
plain trace file (without snapshots: the block grid then has nothing to draw, the other views work).
An instructor records a run on a GPU and replays it on a laptop.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from minfer.kv.block_pool import PoolSnapshot
from minfer.request import RequestMetrics, RequestOutput
from minfer.trace import StepTrace

if TYPE_CHECKING:
    from minfer.engine import LLMEngine

@dataclass(slots=True)
class Recording:
    """A run as plain data. ``snapshots[i]`` and ``gpu_memory[i]`` belong to ``trace[i]`` (None: not kept)."""

    trace: list[StepTrace] = field(default_factory=list)
    snapshots: list[PoolSnapshot | None] = field(default_factory=list)  # the pool after each step
    metrics: dict[str, RequestMetrics] = field(default_factory=dict)  # request id → its timestamps
    gpu_memory: list[int | None] = field(default_factory=list)  # bytes allocated on the GPU after each step

    def __len__(self) -> int:
        return len(self.trace)

    def snapshot_at(self, index: int) -> tuple[int, PoolSnapshot] | None:
        """The pool at step ``index``, or the latest kept before it (its index says which): None if none."""
        for i in range(min(index, len(self.snapshots) - 1), -1, -1):
            if (snap := self.snapshots[i]) is not None:
                return i, snap
        return None

    def save(self, path: str | Path) -> None:
        finished_at = {rid: i for i, t in enumerate(self.trace) for rid in t.finished}
        last = len(self.trace) - 1
        per_line: list[dict[str, dict]] = [{} for _ in self.trace]
        for rid, m in self.metrics.items():  # each request once: where it finished, else on the last line
            if last >= 0:
                per_line[finished_at.get(rid, last)][rid] = asdict(m)
        with open(path, "w") as f:
            for i, t in enumerate(self.trace):
                snap = self.snapshots[i] if i < len(self.snapshots) else None
                mem = self.gpu_memory[i] if i < len(self.gpu_memory) else None
                line = asdict(t) | {"snapshot": asdict(snap) if snap else None, "metrics": per_line[i],
                                    "gpu_memory": mem}
                f.write(json.dumps(line) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Recording:
        """Read a file written by ``Recording.save`` or by ``minfer.trace.save_trace``."""
        rec = cls()
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                d = json.loads(line)
                rec.trace.append(StepTrace.from_dict(d))
                snap = d.get("snapshot")
                rec.snapshots.append(PoolSnapshot(**snap) if snap else None)
                rec.gpu_memory.append(d.get("gpu_memory"))
                rec.metrics.update({rid: RequestMetrics(**m) for rid, m in d.get("metrics", {}).items()})
        return rec


def gpu_memory_allocated(engine: LLMEngine) -> int | None:
    """Bytes the engine's CUDA device has allocated now (None on the CPU or in the simulator)."""
    cfg = engine.config
    if cfg.executor != "model" or not cfg.device.startswith("cuda"):
        return None
    import torch

    return torch.cuda.memory_allocated(cfg.device)


class Recorder:
    """Steps an engine and records each step: ``recorder.step()`` in place of ``engine.step()``.

    ``keep_snapshots=False`` keeps only the latest pool snapshot (for very long runs with large pools:
    a snapshot is a few lists as long as the pool).
    """

    def __init__(self, engine: LLMEngine, keep_snapshots: bool = True) -> None:
        if not engine.config.record_trace:
            raise ValueError("the Recorder needs an engine with record_trace=True")
        self.engine = engine
        self.keep_snapshots = keep_snapshots
        self.recording = Recording()

    def step(self) -> list[RequestOutput]:
        engine, rec = self.engine, self.recording
        outputs = engine.step()
        rec.trace.append(engine.trace[-1])
        if not self.keep_snapshots and rec.snapshots:
            rec.snapshots[-1] = None
        rec.snapshots.append(engine.block_pool.snapshot())
        rec.gpu_memory.append(gpu_memory_allocated(engine))
        for out in outputs:  # the step's own outputs: an engine may keep only its latest finished requests
            if out.finished:
                rec.metrics[out.request_id] = out.metrics
        return outputs

    def sync_metrics(self) -> None:
        """Add the metrics of requests still queued or running (their arrival times: the timeline shows
        them waiting). Called before drawing, not every step: it walks every unfinished request."""
        for req in self.engine.unfinished_requests():
            self.recording.metrics.setdefault(req.request_id, req.metrics)

    def done(self) -> bool:
        return not self.engine.has_unfinished_requests()

    def run(self, max_steps: int | None = None) -> Recording:
        """Step until every request has finished (or ``max_steps`` steps); returns the recording."""
        n = 0
        while not self.done() and (max_steps is None or n < max_steps):
            self.step()
            n += 1
        self.sync_metrics()
        return self.recording
