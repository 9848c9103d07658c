"""The built-in model repository, served when no repository is given: built in code on first use,
cached, never downloaded.

Models (one ``<repo>/<model>/config.yaml`` + ``<repo>/<model>/1/model.<ext>`` each):
  squeezenet   SqueezeNet 1.1, synthetic weights (ONNX)        the seed's latency workload
  digits_mlp   MLP trained on scikit-learn's digits (ONNX)     real predictions
  tabular_xgb  XGBoost trained on breast cancer (XGBoost JSON) real predictions

Optional models (``ensure_builtin_model``) are added to the complete repository on first request,
not built with it and not served by default: the INT8 variants (models/int8.py).

Cache: ``<root>/builtin-v4`` where ``<root>`` is the ``cache_dir`` argument, else
``$LUMENRT_CACHE_DIR``, else ``$XDG_CACHE_HOME/lumenrt`` (default ``~/.cache/lumenrt``). The folder
name carries a format version: change ``BUILTIN_VERSION`` whenever a model or config changes, and
the next start builds the new one beside the old.

Invariants
  - A repository folder that exists under its final name is complete: it is built in a temporary
    folder beside it, its marker file is written (and synced) last, and only then is it renamed
    into place (rename(2) is atomic within one file system). A crash leaves only a temporary folder.
  - Builds are serialized across threads and processes by flock(2) on ``<root>/builtin-v4.lock``
    (released by the kernel when a builder dies). So whoever holds the lock and finds temporary
    folders knows they are leftovers of a crashed build, and removes them.
  - The fast path (repository complete) takes no lock and imports no ML library.
  - An optional model's folder that exists under its final name is complete, the same way: built
    in a hidden temporary folder inside the repository (``ModelRepository`` skips hidden folders),
    synced, renamed into place, all under the same lock. The repository's marker does not list
    optional models; each one's config says how it was made.
"""

import fcntl
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

BUILTIN_VERSION = "builtin-v4"
MODEL_NAMES = ("squeezenet", "digits_mlp", "tabular_xgb")
QUANTIZABLE = ("squeezenet", "digits_mlp")  # the ONNX ones, with calibration and held-out data
# Synthetic images can be made in any number; quantizing holds out this many by default (guessed:
# agreement to 1/64; 1.2 s of FP32 + INT8 SqueezeNet compute here, measured at 10.7 + 7.8 ms each).
SYNTHETIC_HELD_OUT = 64
MARKER = ".lumenrt-builtin.json"  # written last; its presence means "complete"
CACHE_ENV = "LUMENRT_CACHE_DIR"
_TMP_PREFIX = f".{BUILTIN_VERSION}.tmp-"


def default_cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "lumenrt"


def builtin_repository_path(cache_dir: Path | str | None = None) -> Path:
    """Where the built-in repository lives (built or not)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    return root / BUILTIN_VERSION


def is_complete(repo: Path) -> bool:
    return (repo / MARKER).is_file()


def ensure_builtin_repository(cache_dir: Path | str | None = None) -> Path:
    """The built-in repository's folder, built first if it is not in the cache yet (about a
    second). Safe to call from several threads and processes at once: one builds, the others wait
    for it and reuse its result."""
    repo = builtin_repository_path(cache_dir)
    if is_complete(repo):
        return repo
    root = repo.parent
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(root / f"{BUILTIN_VERSION}.lock"):
        if is_complete(repo):  # built by another while we waited for the lock
            return repo
        if repo.exists():  # without its marker: not ours, or damaged by hand; rebuilt
            shutil.rmtree(repo)
        _build_in_place(repo, _TMP_PREFIX, build_repository)
    return repo


def _build_in_place(final: Path, prefix: str, build: Callable[[Path], object]) -> None:
    """``build`` into a fresh temporary folder beside ``final`` (its name starting with ``prefix``),
    then renamed to ``final``: under the lock, so temporary folders found first are leftovers of
    crashed builds and go (the invariants at the top)."""
    parent = final.parent
    for leftover in parent.glob(f"{prefix}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it 0700; the repository is readable like its files
        build(tmp)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(parent)


def ensure_builtin_model(
    name: str, write: Callable[[Path, Path], dict[str, Any]], cache_dir: Path | str | None = None
) -> Path:
    """The built-in repository's folder, with the optional model ``name`` added first if it is not
    there yet: ``write(repo, model_dir)`` writes its files into the empty ``model_dir`` and returns
    its config. Safe against concurrent first requests and crashed builds, like the repository."""
    repo = ensure_builtin_repository(cache_dir)
    final = repo / name
    if final.is_dir():
        return repo
    with _exclusive_lock(repo.parent / f"{BUILTIN_VERSION}.lock"):
        if final.is_dir():  # added by another while we waited for the lock
            return repo

        def build(tmp: Path) -> None:
            _write_config(tmp, write(repo, tmp))
            _fsync_tree(tmp)

        _build_in_place(final, f".{name}.tmp-", build)
    return repo


def _write_config(model_dir: Path, config: dict[str, Any]) -> None:
    import yaml

    (model_dir / "config.yaml").write_text(
        f"# built by lumenrt.models.builtin ({BUILTIN_VERSION}); do not edit, delete the folder to rebuild\n"
        + yaml.safe_dump(config, sort_keys=False, default_flow_style=None, width=110)
    )


def build_repository(dest: Path) -> dict[str, Any]:
    """Build every built-in model into the existing empty folder ``dest``; write the marker last.
    Returns the marker's content (what was built, with test accuracies and timings)."""
    start = time.perf_counter()
    models: dict[str, Any] = {}
    for name, write in _writers().items():
        model_start = time.perf_counter()
        model_dir = dest / name
        model_dir.mkdir()
        config = write(model_dir)
        _write_config(model_dir, config)
        files = sorted(p for p in model_dir.rglob("*") if p.is_file())
        models[name] = {
            "build_s": round(time.perf_counter() - model_start, 3),
            "files": {str(p.relative_to(model_dir)): p.stat().st_size for p in files},
            **config.get("parameters", {}).get("training", {}),
        }
    info = {
        "format": BUILTIN_VERSION,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "build_s": round(time.perf_counter() - start, 3),
        "libraries": {lib: _version(lib) for lib in ("numpy", "onnx", "scikit-learn", "xgboost")},
        "models": models,
    }
    _fsync_tree(dest)
    marker = dest / MARKER
    with marker.open("w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(dest)
    return info


def builtin_info(repo: Path) -> dict[str, Any]:
    """The marker's content of a complete repository."""
    info: dict[str, Any] = json.loads((repo / MARKER).read_text())
    return info


def builtin_examples(name: str, batch: int | None = None) -> dict[str, npt.NDArray[Any]]:
    """A small real input batch for a built-in model, keyed by input name: held-out digits images
    (pixel intensities 0..16), held-out breast-cancer rows, or deterministic standard-normal images.
    ``batch`` defaults to 4 images, 8 digits, 8 rows."""
    if name == "squeezenet":
        from lumenrt.models import squeezenet

        return {squeezenet.INPUT_NAME: squeezenet.example_images(4 if batch is None else batch)}
    if name == "digits_mlp":
        from lumenrt.models import digits

        x, _ = digits.held_out()
        return {digits.INPUT_NAME: _rows(x, 8 if batch is None else batch)}
    if name == "tabular_xgb":
        from lumenrt.models import tabular

        x, _ = tabular.held_out()
        return {tabular.INPUT_NAME: _rows(x, 8 if batch is None else batch)}
    raise KeyError(f"no built-in model {name!r} (built-in: {', '.join(MODEL_NAMES)})")


def builtin_calibration(name: str, count: int) -> dict[str, npt.NDArray[Any]]:
    """At most ``count`` calibration inputs for quantizing a built-in ONNX model, never its held-out
    ones: digits rows of the training split, or standard-normal images of another seed than the
    examples'."""
    if name == "squeezenet":
        from lumenrt.models import squeezenet

        return {squeezenet.INPUT_NAME: squeezenet.example_images(count, squeezenet.CALIBRATION_SEED)}
    if name == "digits_mlp":
        from lumenrt.models import digits

        return {digits.INPUT_NAME: np.array(digits.calibration_rows()[:count])}  # a copy: writable
    raise KeyError(f"no calibration data for {name!r} (built-in ONNX models: {', '.join(QUANTIZABLE)})")


def builtin_held_out(
    name: str, count: int | None = None
) -> tuple[dict[str, npt.NDArray[Any]], npt.NDArray[np.int64] | None]:
    """At most ``count`` held-out inputs of a built-in ONNX model (default: all there are, or
    ``SYNTHETIC_HELD_OUT`` images), and their labels where the model has them (digits: the
    held-out quarter of the data and its labels; SqueezeNet: the example images, no labels)."""
    if name == "squeezenet":
        from lumenrt.models import squeezenet

        images = squeezenet.example_images(SYNTHETIC_HELD_OUT if count is None else count)
        return {squeezenet.INPUT_NAME: images}, None
    if name == "digits_mlp":
        from lumenrt.models import digits

        x, y = digits.held_out()
        return {digits.INPUT_NAME: np.array(x[:count])}, np.array(y[:count])  # copies: writable
    raise KeyError(f"no held-out data for {name!r} (built-in ONNX models: {', '.join(QUANTIZABLE)})")


def _rows(x: npt.NDArray[np.float32], batch: int) -> npt.NDArray[np.float32]:
    if not 0 < batch <= len(x):
        raise ValueError(f"batch must be in 1..{len(x)}, got {batch}")
    return np.array(x[:batch])  # a copy: the split is shared and read-only (models/split.py)


def _writers() -> dict[str, Callable[[Path], dict[str, Any]]]:
    from lumenrt.models import digits, squeezenet, tabular

    writers: dict[str, Callable[[Path], dict[str, Any]]] = {
        "squeezenet": squeezenet.write,
        "digits_mlp": digits.write,
        "tabular_xgb": tabular.write,
    }
    assert tuple(writers) == MODEL_NAMES
    return writers


@contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    # Each call opens its own file description, so the lock also excludes other threads.
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            _fsync_file(path)
    for path in [*root.rglob("*"), root]:
        if path.is_dir():
            _fsync_dir(path)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"
