"""The model repository: one folder per model, one numbered folder per version.

    <root>/<model>/config.yaml            (or config.yml / config.json)
    <root>/<model>/<version>/model.onnx   (a file named in the backend's ``model_files``)

Versions are folder names that are positive integers written plainly (``1``, ``12``); other
folders (``__pycache__``, ``.ipynb_checkpoints``, ``01``) are not versions and are ignored. Which
versions load follows the config's ``version_policy``: the highest one by default. Inputs and
outputs the config does not list are read from the model file through ``Backend.describe``: inputs
the config leaves out are added (the model needs them all), outputs only when the config lists none
(listing some outputs selects those, as in Triton). Where both say something the config wins, and a
contradiction (a name the model lacks, datatype, rank, a fixed size) is refused.
"""

from dataclasses import dataclass, replace
from pathlib import Path

from lumenrt.backends.base import Backend, get_backend
from lumenrt.engine.config import (
    ConfigError,
    ModelConfig,
    TensorSpec,
    model_config_from_dict,
    read_config_file,
)

CONFIG_FILES = ("config.yaml", "config.yml", "config.json")


def load_model_config(path: Path, *, default_name: str) -> ModelConfig:
    """Read and check a model config file (.yaml, .yml or .json), its backend included (one that
    is registered). ``default_name`` is the model folder's name: the model's name, which a
    ``name`` key may repeat but not change."""
    config = model_config_from_dict(read_config_file(path), str(path), default_name)
    get_backend(config.backend, config.source)  # ConfigError naming the backends there are
    return config


class ModelNotFound(LookupError):
    """A model, a version or a model file that is not in the repository; ``path`` is where it
    was looked for."""

    def __init__(self, message: str, path: Path) -> None:
        super().__init__(message)
        self.path = path


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model folder as the repository index sees it, without loading anything."""

    name: str
    versions: tuple[int, ...]  # version folders present, ascending
    has_config: bool
    problems: tuple[str, ...] = ()  # why ``load`` would fail; () = loadable

    @property
    def loadable(self) -> bool:
        return not self.problems


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """One version ready for a backend to load: its config with every input and output filled."""

    config: ModelConfig
    version: int
    model_path: Path


class ModelRepository:
    """The repository folder. Names come from requests too (load, unload, infer), so a name is one
    plain folder name, never a path, and everything loaded (the model folder, the version folder,
    the model file, a Python model's code) must resolve inside the repository: a symlink that
    leads out of it is refused (400) rather than followed."""

    __slots__ = ("_real_root", "_trusted", "root")

    def __init__(self, root: Path, trusted: tuple[Path, ...] = ()) -> None:
        """``trusted``: folders outside ``root`` that its links may lead into, as the operator said
        (``lumenrt serve --model-dir``: a repository of links to the mounted model folder)."""
        self.root = Path(root)
        if not self.root.is_dir():
            raise ModelNotFound(f"{self.root}: model repository folder does not exist", self.root)
        self._real_root = self.root.resolve()
        self._trusted = tuple(t.resolve() for t in trusted)

    def _inside(self, path: Path) -> Path:
        """``path`` if it resolves inside the repository; else a ConfigError (400) saying where to."""
        real = path.resolve()
        if not real.is_relative_to(self._real_root) and not any(
            real.is_relative_to(t) for t in self._trusted
        ):
            raise ConfigError(
                path,
                "",
                f"resolves to {real}, outside the model repository {self._real_root}: "
                "a model's folders and files must be inside it (a symlink out of it is refused)",
            )
        return path

    def names(self) -> list[str]:
        """Model folders, sorted (hidden folders are skipped)."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def index(self) -> list[ModelEntry]:
        """Every model folder with its versions and, without raising, what stops it loading."""
        entries = []
        for name in self.names():
            folder = self.root / name
            versions = _versions(folder)
            problems: list[str] = []
            has_config = any((folder / f).is_file() for f in CONFIG_FILES)
            try:
                config = self.config(name)
                backend = get_backend(config.backend, config.source)
                for version in _select(config, versions, folder):
                    _model_file(backend, folder / str(version))
            except (ConfigError, ModelNotFound) as exc:
                problems.append(str(exc))
            entries.append(ModelEntry(name, versions, has_config, tuple(problems)))
        return entries

    def config(self, name: str) -> ModelConfig:
        """The checked config of a model, as written (inputs and outputs not filled)."""
        folder = self._folder(name)
        found = [folder / f for f in CONFIG_FILES if (folder / f).is_file()]
        if not found:
            hint = (
                " (Triton's config.pbtxt is not read: write it as config.yaml)"
                if (folder / "config.pbtxt").exists()
                else ""
            )
            raise ConfigError(folder, "", f"no model config: expected one of {', '.join(CONFIG_FILES)}{hint}")
        if len(found) > 1:
            raise ConfigError(
                folder, "", f"several model configs ({', '.join(p.name for p in found)}): keep one"
            )
        return load_model_config(self._inside(found[0]), default_name=name)

    def versions(self, name: str) -> tuple[int, ...]:
        """Version folders present for a model, ascending."""
        return _versions(self._folder(name))

    def load(self, name: str) -> list[LoadedModel]:
        """The versions that the config's version_policy selects, ascending, each with its model
        file found and its inputs and outputs complete."""
        config = self.config(name)
        folder = self.root / name
        backend = get_backend(config.backend, config.source)
        loaded = []
        for version in _select(config, _versions(folder), folder):
            model_path = self._inside(_model_file(backend, self._inside(folder / str(version))))
            filled = _fill_tensors(config, backend, model_path)
            loaded.append(LoadedModel(config=filled, version=version, model_path=model_path))
        return loaded

    def _folder(self, name: str) -> Path:
        # a name comes from requests too: it must be one plain folder name, never a path
        if not name or name.startswith(".") or any(c in name for c in "/\\\x00") or len(name) > 255:
            raise ModelNotFound(
                f"{self.root}: {name!r} is not a model name (one folder name: no '/', '\\', NUL or leading '.')",
                self.root,
            )
        folder = self.root / name
        if not folder.is_dir():
            raise ModelNotFound(f"{folder}: no such model in the repository {self.root}", folder)
        return self._inside(folder)


def _versions(folder: Path) -> tuple[int, ...]:
    found = [p.name for p in folder.iterdir() if p.is_dir() and p.name.isdigit() and p.name.isascii()]
    return tuple(sorted(int(n) for n in found if n == str(int(n)) and int(n) > 0))


def _select(config: ModelConfig, available: tuple[int, ...], folder: Path) -> tuple[int, ...]:
    if not available:
        raise ModelNotFound(f"{folder}: no version folders (numbered, like {folder / '1'})", folder)
    if config.version_policy == "latest":
        return (available[-1],)
    if config.version_policy == "all":
        return available
    missing = [v for v in config.versions if v not in available]
    if missing:
        path = folder / str(missing[0])
        raise ModelNotFound(
            f"{path}: version {missing[0]} (version_policy.specific in {config.source}) does not exist; "
            f"present: {', '.join(map(str, available))}",
            path,
        )
    return config.versions


def _model_file(backend: Backend, version_folder: Path) -> Path:
    found = [version_folder / f for f in backend.model_files if (version_folder / f).exists()]
    if not found:
        raise ModelNotFound(
            f"{version_folder}: no model file for backend {backend.name!r} (expected {' or '.join(backend.model_files)})",
            version_folder,
        )
    if len(found) > 1:
        raise ConfigError(
            version_folder, "", f"several model files ({', '.join(p.name for p in found)}): keep one"
        )
    return found[0]


def _fill_tensors(config: ModelConfig, backend: Backend, model_path: Path) -> ModelConfig:
    try:
        described_inputs, described_outputs = backend.describe(model_path, config)
    except ConfigError as exc:  # the file cannot say: the config must
        for side, given in (("inputs", config.inputs), ("outputs", config.outputs)):
            if not given:
                raise ConfigError(
                    config.source, side, f"not given, and {model_path} cannot say: {exc}"
                ) from exc
        return config
    except Exception as exc:  # a corrupt or unreadable model file, in whatever form its library reports it
        raise ConfigError(model_path, "", f"cannot read the model file: {type(exc).__name__}: {exc}") from exc
    return replace(
        config,
        inputs=_merge(config.inputs, described_inputs, "inputs", config.source, model_path, fill=True),
        outputs=_merge(config.outputs, described_outputs, "outputs", config.source, model_path, fill=False),
    )


def _merge(
    given: tuple[TensorSpec, ...],
    described: tuple[TensorSpec, ...],
    key: str,
    source: str,
    model_path: Path,
    *,
    fill: bool,
) -> tuple[TensorSpec, ...]:
    """The config's tensors checked against the model's. With ``fill`` (inputs: a model needs all
    of them) the result is the model's tensors in the model's order, the config's spec replacing
    the model's where it has one; without (outputs: as in Triton, listing some selects those) the
    model's are used only when the config lists none. ``dims`` compare in the config's convention
    (describe is given the config, and so knows whether the batch dimension is left out)."""
    if not described:  # the file says nothing about this side: the config stands as written
        return given
    if not given:
        return described
    in_model = {spec.name: spec for spec in described}
    for i, spec in enumerate(given):
        model = in_model.get(spec.name)
        path = f"{key}[{i}]"
        if model is None:
            names = ", ".join(repr(s.name) for s in described)
            raise ConfigError(
                source, f"{path}.name", f"{spec.name!r} is not in {model_path} (it has {names})"
            )
        if spec.datatype != model.datatype:
            raise ConfigError(
                source,
                f"{path}.datatype",
                f"{spec.name!r} is {spec.datatype} here but {model.datatype} in {model_path}",
            )
        if len(spec.dims) != len(model.dims) or any(
            a != b and a != -1 and b != -1 for a, b in zip(spec.dims, model.dims, strict=False)
        ):
            raise ConfigError(
                source,
                f"{path}.dims",
                f"{spec.name!r} has dims {list(spec.dims)} here but {list(model.dims)} in {model_path}",
            )
    if not fill:
        return given
    by_name = {spec.name: spec for spec in given}
    return tuple(by_name.get(spec.name, spec) for spec in described)
