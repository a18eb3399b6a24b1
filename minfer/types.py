"""The words the layers share: finish reasons, policy and admission names, backends, devices, preemption.

Each is a ``Literal`` type, so a type checker catches a misspelt ``"fcfs"`` or ``"lenght"`` where it is
written, and ``allowed(T)`` gives the same names to the checks that refuse a bad value at run time --
one list of names, read by both. This module sits at the bottom of the package: it imports nothing of
minfer, and everything may import it.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

FinishReason = Literal["stop", "length", "abort", "rejected", "timeout", "error"]
"""Why a request ended. ``stop``: EOS, a stop token or a stop string; ``length``: ``max_tokens`` or the
model's length limit; ``abort``: the client (``abort_request``); ``rejected``: refused by admission control or
shed; ``timeout``: waited longer than ``max_queue_time``; ``error``: something failed while serving this one
request (the message is its ``stop_reason``), and every other request went on."""

PolicyName = Literal["fcfs", "priority", "sjf", "fair", "capstone"]
AdmissionMode = Literal["optimistic", "reserve"]
ExecutorName = Literal["model", "sim"]
BackendName = Literal["auto", "torch", "triton", "cpp"]
LinearBackendName = Literal["auto", "torch", "cpp", "onednn"]
PointwiseBackendName = Literal["auto", "torch", "cpp"]
"""How the model's matrix products run: ``torch`` (``x @ W``), ``cpp`` (weights packed once for minfer's C++ kernel,
float32 on the CPU) or ``onednn`` (packed once for oneDNN's CPU kernels); ``auto``: the first of ``cpp``, ``onednn``
that runs the model's dtype on this CPU, else ``torch`` (``minfer/ops/linear.py``)."""
DType = Literal["auto", "float32", "bfloat16", "float16"]
TimeoutAction = Literal["finish", "promote"]
DeviceType = Literal["cpu", "cuda"]
PreemptionMode = Literal["recompute", "swap"]
"""What preemption does with a victim's KV blocks. ``recompute``: drop them, and compute the tokens again on
return; ``swap``: copy them to host memory and back on return (recompute when the host pool is full)."""
ResumeRule = Literal["whole", "first_chunk"]
"""When a preempted request may come back. ``whole``: once its whole recompute (or swap-in) plus its next
token fits, and those blocks are taken at once; ``first_chunk``: as soon as its first chunk fits, like a new
request -- which can thrash (preempted again a step later, recomputing for nothing)."""


def allowed(literal: Any) -> tuple[str, ...]:
    """The names a ``Literal`` type admits, in the order written: ``allowed(PolicyName)``."""
    return get_args(literal)
