"""The engine plans every model together and keeps running models where they are (#15): a model
loaded later is planned around them; a refused plan names the placement and loads nothing."""

import pytest

from lumenrt.engine.engine import Engine
from lumenrt.engine.server_config import EngineConfig
from lumenrt.models.builtin import builtin_examples
from lumenrt.placement.plan import PlacementError


def test_a_model_loaded_later_does_not_move_the_running_ones() -> None:
    settings = EngineConfig(lane="queue", placement="spread")
    with Engine(models=["digits_mlp"], settings=settings) as engine:
        assert engine.plan is not None
        before = engine.plan.model("digits_mlp").workers
        placements = engine.runtime("digits_mlp").placements
        engine.load("squeezenet")
        assert engine.plan.model("digits_mlp").workers == before
        assert engine.runtime("digits_mlp").placements == placements
        held = {c for w in before for c in w.cpus}
        later = engine.plan.model("squeezenet")
        # planned around digits_mlp's CPUs: on them only if it had them all, and then said
        assert later.shared == bool(held & {c for w in later.workers for c in w.cpus})
        if held == set(engine.settings.cores):  # this VM: one node, digits_mlp's one instance took both
            assert later.shared and any("squeezenet: no CPU left" in w for w in engine.plan.warnings)
        engine.infer("squeezenet", builtin_examples("squeezenet", 1))
        engine.unload("squeezenet")
        engine.load("squeezenet")
        assert engine.plan.model("digits_mlp").workers == before


def test_a_strict_plan_that_cannot_fit_loads_nothing() -> None:
    # one CPU for three models and the event loop: cannot fit on any machine
    settings = EngineConfig(lane="queue", placement="spread", placement_strict=True, cores=(0,))
    with pytest.raises(PlacementError, match=r"placement \(spread\): .*strict placement refuses"):
        Engine(models=["digits_mlp", "squeezenet", "tabular_xgb"], settings=settings, ingress_threads=1)
