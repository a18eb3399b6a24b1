"""The simulator against measurements: how close are its step times to what engines really measure?

Two checks, one idea: fit a few numbers with a physical meaning on some measurements, then score the
simulator on measurements the fit never saw.

* ``published``: GPU runs that others published (TensorRT-LLM's tables, with their sources), re-created on
  the simulator; fits the shares of the datasheet peaks that ``minfer.sim.hardware``'s GPU specs carry.
* ``calibrate``: step times of the real engine on this machine; fits the course CPU's spec.

    python -m minfer.validate.published        # predicted vs published, the error of each point, medians
    python -m minfer.validate.calibrate        # measure this machine, fit, report

Both drive a whole ``LLMEngine`` (the simulator's, or the real model's), so they sit above the engine; the
simulator itself (``minfer.sim``) stays a leaf under it, and importing it loads no engine.
"""
