"""Weights in fewer bytes: int8 and 4-bit formats for the model's matrix products.

A decode step reads every weight of the model once and does two floating-point operations with each, so its time
is bytes over memory bandwidth (chapter 01 measures it). Storing a weight in 8 or 4 bits instead of 32 moves that
bound by 4x or 6x; the arithmetic stays float32, each weight turned back into a float as it is used.

* ``formats``: the two formats -- ``Int8Weight`` (symmetric int8, one float16 scale per group of 32 weights: the
  layout of the GGUF's Q8_0) and ``Q4Weight`` (4-bit values with a float16 scale and minimum per group of 32: the
  GGUF's Q4_1) -- with ``quantize_int8``, ``quantize_q4`` and ``dequantize``;
* ``gguf``: the blocks of a GGUF file in those formats, as the file stores them (SmolLM2's GGUF *is* Q4_1, with a
  Q8_0 embedding), so ``weights="q4"`` multiplies the very numbers the file holds.

The kernels that multiply them are ``minfer/ops/quant_linear.py``; the speed-up layer (``minfer/accelerate.py``)
chooses them once, at engine build; ``minfer/quality.py`` measures what each format costs in quality.
"""
