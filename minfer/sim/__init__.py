"""The simulator: the real scheduler and BlockPool on modelled hardware, no weights needed.

    engine = LLMEngine(EngineConfig(model="llama-3-8b", executor="sim", hardware="H100-SXM"))

``hardware`` names a spec in ``HARDWARE`` and ``model`` one in ``MODELS`` (or pass your own
``HardwareSpec`` / ``ModelSpec``); prompts are token-id lists. The GPU specs carry what a well-tuned engine
achieves of the datasheet peaks; ``spec.roofline()`` is the upper bound.

The simulator is a leaf under the engine: nothing here imports ``minfer.engine`` or the model runner. What
checks it against measurements drives a whole engine, so it lives above, in ``minfer.validate``
(``python -m minfer.validate.published``: the simulator against published GPU runs).
"""

from minfer.sim.cost import RooflineCost, StepShape, roofline_terms
from minfer.sim.executor import SimExecutor, build_sim_executor, kv_pool_blocks
from minfer.sim.hardware import HARDWARE, HardwareSpec, get_hardware
from minfer.sim.models import MODELS, ModelSpec, get_model_spec

__all__ = ["HARDWARE", "MODELS", "HardwareSpec", "ModelSpec", "RooflineCost", "SimExecutor", "StepShape",
           "build_sim_executor", "get_hardware", "get_model_spec", "kv_pool_blocks", "roofline_terms"]
