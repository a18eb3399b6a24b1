"""Hidden cases of E10.1 (an SLO's verdict on one request): targets of zero, TPOT's definition over n - 1 gaps,
and random requests and targets compared with the reference's verdict (hypothesis), boundaries included.

Chapter 10, hidden: the attention terms (E10.4) equal the reference's on random steps of every model.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from minfer.exercises.checks.ch10 import finished, verdict
from minfer.exercises.harness import Tester
from minfer.exercises.hidden.reference import reference_functions
from minfer.exercises.standin import StandIns
from minfer.metrics import SLO
from minfer.sim.cost import StepShape, roofline_terms
from minfer.sim.models import MODELS

TIMES = st.sampled_from([0.0, 0.05, 0.1, 0.12, 0.25, 0.5, 1.0, 1.5, 2.0])  # targets and gaps meet exactly, too
REASONS = st.sampled_from(["stop", "length", "rejected", "timeout", "abort", "error", None])


def check_slo(t: Tester) -> None:
    with t.case("a target of zero is a target (not 'no target'): only a zero latency meets it",
                hint="test a target with `is not None`: 0.0 is falsy, but it is a target every real request misses"):
        verdict(SLO(ttft=0.0), finished("length"), False, "ttft 0.5 against a ttft target of 0")
        verdict(SLO(tpot=0.0), finished("length"), False, "tpot 0.05 against a tpot target of 0")
        verdict(SLO(e2e=0.0), finished("length"), False, "e2e 1.0 against an e2e target of 0")

    with t.case("TPOT is the mean of the n - 1 gaps between n tokens, up to the last token (not to the finish)",
                hint="use metrics.tpot: (last token time - first token time) / (tokens - 1); the time after the "
                     "last token (finishing, detokenizing) is no token's"):
        verdict(SLO(tpot=0.1), finished("length", gaps=(0.12, 0.12)), False, "two gaps of 0.12 against 0.1")
        verdict(SLO(tpot=0.1), finished("length", gaps=(0.1, 0.1), e2e=5.0), True,
                "gaps of 0.1, finished 4.5 s after the last token")

    with t.case("random requests and targets: the reference's verdict every time",
                hint="a served request (finish reason 'stop' or 'length') meets an SLO when each target that is set "
                     "is met (<=); a missing TTFT or E2E misses its target, a missing TPOT (one token) does not"):
        reference = reference_functions("E10.1")["SLO.met_by"]

        @settings(max_examples=400, deadline=None, derandomize=True, database=None)
        @given(REASONS, st.one_of(st.none(), TIMES), st.lists(TIMES, max_size=3), st.one_of(st.none(), TIMES),
               st.one_of(st.none(), TIMES), st.one_of(st.none(), TIMES), st.one_of(st.none(), TIMES))
        def same_verdict(reason, ttft, gaps, e2e, ttft_slo, tpot_slo, e2e_slo) -> None:
            req = finished(reason, ttft=ttft, gaps=tuple(gaps) if ttft is not None else (), e2e=e2e)
            slo = SLO(ttft=ttft_slo, tpot=tpot_slo, e2e=e2e_slo)
            m = req.metrics
            verdict(slo, req, reference(slo, req),
                    f"{slo} for finish reason {reason!r}, ttft {m.ttft}, tpot {m.tpot}, e2e {m.e2e}")

        same_verdict()


def random_terms(seed: int) -> list[list[tuple[float, float]]]:
    rng = random.Random(seed)
    out = []
    for name in sorted(MODELS):
        for dtype in ("bfloat16", "float32"):
            shape = StepShape()
            for _ in range(rng.randrange(0, 6)):
                shape.add(rng.randrange(0, 4000), 1, is_decode=True, samples=True)
            for _ in range(rng.randrange(0, 3)):
                shape.add(rng.randrange(0, 2000), rng.randrange(1, 600), is_decode=False, samples=rng.random() < 0.5)
            out.append(roofline_terms(MODELS[name], dtype, shape))
    return out


def check_attention_terms(t: Tester) -> None:
    with t.case("random steps of every model and dtype: the same terms as the reference",
                hint="compare your prefill and decode (FLOPs, bytes) with the formulas in the task, term by term"):
        for seed in range(3):
            mine = random_terms(seed)
            with StandIns() as swaps:
                swaps.install(["E10.4"], always=True)
                ref = random_terms(seed)
            assert mine == ref, f"seed {seed}: the terms differ from the reference"
