"""SpeculativeConfig: how many tokens to guess per step, and where the guesses come from.

Passed as vLLM passes it, a plain dict -- ``LLM(..., speculative_config={"method": "ngram",
"num_speculative_tokens": 4})`` -- and checked here once, when the engine's configuration is built, like every
other knob: a wrong name or range fails with the field's name before any weights load.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from minfer import input_checks as check
from minfer.types import SpeculativeMethod, allowed

METHODS = allowed(SpeculativeMethod)


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    method: SpeculativeMethod = "ngram"
    num_speculative_tokens: int = 4  # k: guesses per request per step (the scheduler reserves k lookahead slots)
    # ngram (prompt lookup): match the text's last n tokens, for n from prompt_lookup_max down to prompt_lookup_min
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # early_exit: the draft is the model's first num_draft_layers layers (None: a quarter of them)
    num_draft_layers: int | None = None
    # executor="sim" only: the chance that each guess is right (the simulator has no text to look guesses up in);
    # each request's guesses are then kept up to the first wrong one, as the real verification keeps them
    acceptance_rate: float | None = None

    def __post_init__(self) -> None:
        check.one_of("speculative_config method", self.method, METHODS)
        check.integer("num_speculative_tokens", self.num_speculative_tokens, 1, 64)
        check.integer("prompt_lookup_min", self.prompt_lookup_min, 1)
        check.integer("prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min)
        if self.num_draft_layers is not None:
            check.integer("num_draft_layers", self.num_draft_layers, 1)
        if self.acceptance_rate is not None:
            check.real("acceptance_rate", self.acceptance_rate, 0.0, 1.0)

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict[str, Any] | None) -> SpeculativeConfig | None:
        """``speculative_config`` as given (None, a dict of vLLM's names, or a ``SpeculativeConfig``) → checked."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict such as {{'method': 'ngram', "
                             f"'num_speculative_tokens': 4}}, got {type(value).__name__}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(value) - known):
            raise ValueError(f"speculative_config has no field(s) {unknown}; it takes {sorted(known)}")
        return cls(**value)
