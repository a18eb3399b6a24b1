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
WeightFormat = Literal["dtype", "int8", "q4"]
"""How the weights of the model's matrix products are stored, which sets the bytes a decode step reads (``dtype`` is
the other knob: the number type everything is *computed* in -- activations, KV cache, norms). ``dtype``: in the
model's dtype, as loaded (float32 on the CPU, bfloat16 on CUDA); ``int8``: 8 bits a weight, a float16 scale per 32
(``minfer/quant/formats.py``); ``q4``: 4 bits a weight with a scale and minimum per 32 -- the GGUF's own Q4_1 blocks
when the model is a GGUF that has them, its LM head in int8 as that GGUF keeps it. The arithmetic stays in ``dtype``:
bfloat16 is a dtype, not a weight format, because it changes every sum, not only the bytes of the weights."""
SpeculativeMethod = Literal["ngram", "early_exit"]
"""Where speculative decoding's guesses come from (``minfer/spec``). ``ngram``: prompt lookup -- the tokens that
followed the latest earlier occurrence of the text's last few tokens; ``early_exit``: the model's own first
layers, then its final norm and LM head (self-speculation): a draft model that shares the target's weights and
KV cache."""
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
