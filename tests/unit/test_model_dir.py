"""``--model-dir`` (engine/model_dir.py): a repository is served as it is; one model's folder, as a
platform mounts it (KServe: ``/mnt/models/model.onnx``), is served as one model through links; bad
folders are refused with the reason."""

import importlib
import shutil
from pathlib import Path

import numpy as np
import pytest

from lumenrt.backends.base import BUNDLED, BUNDLED_MODEL_FILES
from lumenrt.engine.config import ConfigError
from lumenrt.engine.engine import Engine
from lumenrt.engine.model_dir import repository_for
from lumenrt.engine.server_config import EngineConfig
from lumenrt.models.builtin import builtin_examples, ensure_builtin_repository


@pytest.mark.parametrize("backend", sorted(BUNDLED))
def test_the_file_names_match_each_backends_own(backend: str) -> None:
    try:
        module = importlib.import_module(f"lumenrt.backends.{BUNDLED[backend]}")
    except ImportError:
        pytest.skip(f"{backend}'s library is not installed")
    (cls,) = [
        c for c in vars(module).values() if getattr(c, "name", None) == backend and hasattr(c, "model_files")
    ]
    assert set(cls.model_files) == {f for f, b in BUNDLED_MODEL_FILES.items() if b == backend}


def test_a_repository_is_served_as_it_is(tmp_path: Path) -> None:
    repo = ensure_builtin_repository()
    assert repository_for(repo, None, tmp_path / "links").root == repo
    with pytest.raises(ConfigError, match="this is a repository"):
        repository_for(repo, "digits", tmp_path / "links")


def test_one_models_folder_is_served_under_its_name(tmp_path: Path) -> None:
    mounted = tmp_path / "mnt" / "models"  # what KServe's storage initializer leaves
    mounted.mkdir(parents=True)
    shutil.copy(ensure_builtin_repository() / "digits_mlp" / "1" / "model.onnx", mounted / "model.onnx")
    repo = repository_for(mounted, "digits", tmp_path / "links")
    assert (repo.root / "digits" / "1" / "model.onnx").is_file() and sorted(
        p.name for p in mounted.iterdir()
    ) == ["model.onnx"]
    with Engine(repo, EngineConfig(thread_count=1, pin=False)) as engine:
        x = builtin_examples("digits_mlp", 2)["input"]
        out = engine.infer("digits", {"input": x}).outputs["probabilities"]
        assert out.shape == (2, 10) and np.allclose(out.sum(axis=1), 1, atol=1e-4)
    assert (
        repository_for(mounted, None, tmp_path / "l2").root.joinpath("models").is_dir()
    )  # the folder's name


def test_a_folders_own_config_is_kept_but_its_name(tmp_path: Path) -> None:
    mounted = tmp_path / "m"
    mounted.mkdir()
    shutil.copy(ensure_builtin_repository() / "digits_mlp" / "1" / "model.onnx", mounted / "model.onnx")
    (mounted / "config.yaml").write_text("name: something_else\nbackend: onnxruntime\nmax_batch_size: 8\n")
    repo = repository_for(mounted, "digits", tmp_path / "links")
    with Engine(repo, EngineConfig(thread_count=1, pin=False)) as engine:
        assert engine.runtime("digits").config.max_batch_size == 8


@pytest.mark.parametrize(
    ("files", "name", "message"),
    [
        ([], None, "found none"),
        (["model.onnx", "model.json"], None, r"found \['model.onnx', 'model.json'\]"),
        (["model.onnx"], "no/slash", "is not a model name"),
    ],
)
def test_a_folder_that_is_neither_is_refused(
    tmp_path: Path, files: list[str], name: str | None, message: str
) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for f in files:
        (folder / f).write_bytes(b"")
    with pytest.raises(ConfigError, match=message):
        repository_for(folder, name, tmp_path / "links")
    with pytest.raises(ConfigError, match="not a folder"):
        repository_for(tmp_path / "nowhere", None, tmp_path / "links")


def test_the_trust_stops_at_the_mounted_folder(tmp_path: Path) -> None:
    """The links may lead into the model's folder, not through it: a model file there that links
    elsewhere is still refused."""
    mounted = tmp_path / "m"
    mounted.mkdir()
    elsewhere = tmp_path / "elsewhere.onnx"
    shutil.copy(ensure_builtin_repository() / "digits_mlp" / "1" / "model.onnx", elsewhere)
    (mounted / "model.onnx").symlink_to(elsewhere)
    repo = repository_for(mounted, "digits", tmp_path / "links")
    with pytest.raises(ConfigError, match="outside the model repository"):
        Engine(repo, EngineConfig(thread_count=1, pin=False))
