"""The package root's public surface: ``from lumenrt import Engine`` (the in-process API the
README shows) and the names a user needs with it, imported on first use."""

import subprocess
import sys

import pytest

import lumenrt
from lumenrt.engine import engine, repository, request, server_config


def test_the_in_process_api_is_importable_from_the_package_root() -> None:
    from lumenrt import Engine, EngineConfig, EngineError, InferResult, ModelNotFound

    assert Engine is engine.Engine and InferResult is engine.InferResult
    assert EngineConfig is server_config.EngineConfig
    assert EngineError is request.EngineError and ModelNotFound is repository.ModelNotFound


def test_every_public_name_resolves_and_request_errors_are_engine_errors() -> None:
    for name in lumenrt.__all__:
        assert getattr(lumenrt, name) is not None, name
    for name in (
        "InvalidInput",
        "ModelNotReady",
        "QueueFull",
        "RequestCancelled",
        "RequestTimeout",
        "WorkerDied",
    ):
        assert issubclass(getattr(lumenrt, name), lumenrt.EngineError), name
    assert sorted(dir(lumenrt)) == sorted(lumenrt.__all__)
    assert set(lumenrt.__all__) == {*lumenrt._PUBLIC, "__version__"}


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Engin'"):
        lumenrt.Engin  # noqa: B018


def test_importing_the_package_does_not_load_the_engine() -> None:
    code = "import sys, lumenrt; print('lumenrt.engine.engine' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
