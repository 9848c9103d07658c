"""Read a results folder (docs/bench-results.md) into typed runs.

Scanning never raises on a bad file: a file that cannot be read, is not JSON, or is a ``load``,
``matrix`` or ``peers`` file missing what the plots need is listed in ``Catalog.skipped`` with the
reason, so the dashboard can say why a file is not shown. Files of other kinds (the older
benchmarks) are listed in ``Catalog.others``. A load run's CSV is read only on demand
(``load_samples``): it can be large, and most views need only the summary.
"""

import csv
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

STAGES = ("queue", "batch", "compute", "return")
"""Server-side stages, in the order a request goes through them."""

PERCENTILES = ("p50", "p90", "p95", "p99", "p99.9", "max")
"""The latency summary keys plotted as percentiles (``min`` and ``mean`` are not percentiles)."""

MAX_LOAD_RUNS = 12
"""Load runs a report shows when it is not given files (the newest ones)."""

FloatArray = npt.NDArray[np.float64]


class ResultError(ValueError):
    """A result file lacks something the plots need; the message says what."""


@dataclass(frozen=True)
class Skipped:
    """A file that was not loaded, and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class ResultFile:
    """Any readable result JSON (the older kinds too): listed, not plotted."""

    path: Path
    rel: str
    kind: str
    created_utc: str


@dataclass(frozen=True)
class StageStats:
    """One server-side stage over a run's ok answers, microseconds."""

    mean_us: float
    p50_us: float | None
    p99_us: float | None


@dataclass(frozen=True)
class Timeseries:
    """Per-interval counts and latency of a run's measured window (``t_s``: interval starts)."""

    interval_s: float
    t_s: list[float]
    ok: list[float]
    errors: list[float]
    throughput_per_s: list[float]
    p50_us: list[float | None]
    p99_us: list[float | None]


@dataclass(frozen=True)
class LoadRun:
    """A ``load`` result: the summary JSON; ``csv_path`` is None when its CSV is not there."""

    path: Path
    rel: str
    name: str
    created_utc: str
    machine: dict[str, Any]
    commit: str | None
    server: dict[str, Any]
    load: dict[str, Any]
    counts: dict[str, Any]
    elapsed_s: float
    throughput_per_s: float
    latency_us: dict[str, float]
    stages_us: dict[str, StageStats] | None
    batch_size_mean: float | None
    timeseries: Timeseries | None
    csv_path: Path | None

    @property
    def label(self) -> str:
        """What a picker shows: the name, then where it came from (names need not be unique)."""
        return f"{self.name}  ({self.rel})"


@dataclass(frozen=True, eq=False)
class LoadSamples:
    """A load run's CSV as columns: one entry per request in intended-send order.

    ``latency_us`` is NaN for a failed request; a stage column is NaN where the server reported
    no stages; ``stages_us`` holds only the stages that have at least one value.
    """

    intended_s: FloatArray
    latency_us: FloatArray
    ok: npt.NDArray[np.bool_]
    stages_us: dict[str, FloatArray] = field(default_factory=dict)

    @property
    def ok_latency_us(self) -> FloatArray:
        return self.latency_us[self.ok & ~np.isnan(self.latency_us)]


@dataclass(frozen=True)
class MatrixRow:
    """One configuration x load point of the architecture table."""

    queue_type: str
    allocator_type: str
    mode: str
    workers: int
    batch_size: int
    load: str
    throughput_per_s: float
    ratio_to_raw: float | None
    p50_us: float | None
    p99_us: float | None
    p99_9_us: float | None
    max_us: float | None
    compute_mean_us: float | None
    errors: int
    run: str | None
    lane: str | None = None  # rows written before the matrix had the dimension: None
    loop_spin_us: int = 0

    @property
    def configuration(self) -> str:
        """A short name of the serve configuration (without the load point)."""
        lane = f" {self.lane}" if self.lane else ""
        spin = f" spin{self.loop_spin_us}" if self.loop_spin_us else ""
        return f"{self.queue_type}/{self.allocator_type}/{self.mode} w{self.workers} b{self.batch_size}{lane}{spin}"


@dataclass(frozen=True)
class MatrixRun:
    """A ``matrix`` result: the table and the raw in-process limit it is compared with."""

    path: Path
    rel: str
    created_utc: str
    machine: dict[str, Any]
    commit: str | None
    model: str
    raw_throughput_per_s: float | None
    raw_threads: int | None
    fixed_rate_per_s: float | None
    saturation_concurrency: int | None
    rows: list[MatrixRow]

    @property
    def label(self) -> str:
        return f"{self.model} matrix {self.created_utc}  ({self.rel})"


@dataclass(frozen=True)
class PeerRow:
    """One peer server x model x concurrency measurement."""

    peer: str
    model: str
    concurrency: int
    driver: str
    protocol: str
    throughput_per_s: float
    p50_us: float | None
    p90_us: float | None
    p95_us: float | None
    p99_us: float | None
    errors: int


@dataclass(frozen=True)
class PeersRun:
    """A ``peers`` result: lumenrt and other servers under the same load."""

    path: Path
    rel: str
    created_utc: str
    machine: dict[str, Any]
    commit: str | None
    peers: dict[str, dict[str, Any]]
    rows: list[PeerRow]

    @property
    def label(self) -> str:
        return f"peers {self.created_utc}  ({self.rel})"


@dataclass
class Catalog:
    """Everything found under one results folder; each list newest first."""

    root: Path
    loads: list[LoadRun] = field(default_factory=list)
    matrices: list[MatrixRun] = field(default_factory=list)
    peers: list[PeersRun] = field(default_factory=list)
    others: list[ResultFile] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def load_by_rel(self, rel: str) -> LoadRun | None:
        return next((run for run in self.loads if run.rel == rel), None)


# --- field readers: each names the missing or wrong field in its error -----------------------------


def _get(doc: dict[str, Any], key: str) -> Any:
    if key not in doc:
        raise ResultError(f"no '{key}' field")
    return doc[key]


def _dict(doc: dict[str, Any], key: str, *, optional: bool = False) -> dict[str, Any]:
    value = doc.get(key) if optional else _get(doc, key)
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise ResultError(f"'{key}' is not an object")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ResultError(f"'{what}' is not a finite number: {value!r}")
    return float(value)


def _opt_number(value: Any, what: str) -> float | None:
    return None if value is None else _number(value, what)


def _int(value: Any, what: str) -> int:
    number = _number(value, what)
    if number != int(number):
        raise ResultError(f"'{what}' is not an integer: {value!r}")
    return int(number)


def _opt_int(value: Any, what: str) -> int | None:
    return None if value is None else _int(value, what)


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ResultError(f"'{what}' is not a string: {value!r}")
    return value


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number_list(value: Any, what: str, *, allow_none: bool = False) -> list[Any]:
    if not isinstance(value, list):
        raise ResultError(f"'{what}' is not a list")
    return [None if v is None and allow_none else _number(v, what) for v in value]


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = _get(doc, "rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ResultError("'rows' is not a list of objects")
    return rows


# --- parsers, one per plotted kind ------------------------------------------------------------------


def _parse_timeseries(doc: Any) -> Timeseries | None:
    if doc is None:
        return None
    if not isinstance(doc, dict):
        raise ResultError("'timeseries' is not an object")
    series = Timeseries(
        interval_s=_number(_get(doc, "interval_s"), "timeseries.interval_s"),
        t_s=_number_list(_get(doc, "t_s"), "timeseries.t_s"),
        ok=_number_list(doc.get("ok", []), "timeseries.ok"),
        errors=_number_list(doc.get("errors", []), "timeseries.errors"),
        throughput_per_s=_number_list(_get(doc, "throughput_per_s"), "timeseries.throughput_per_s"),
        p50_us=_number_list(doc.get("p50_us", []), "timeseries.p50_us", allow_none=True),
        p99_us=_number_list(doc.get("p99_us", []), "timeseries.p99_us", allow_none=True),
    )
    if len(series.throughput_per_s) != len(series.t_s):
        raise ResultError("timeseries.throughput_per_s and timeseries.t_s differ in length")
    return series


def _parse_stages(doc: Any) -> tuple[dict[str, StageStats] | None, float | None]:
    if doc is None:
        return None, None
    if not isinstance(doc, dict):
        raise ResultError("'stages_us' is not an object")
    stages: dict[str, StageStats] = {}
    for stage in STAGES:
        stats = doc.get(stage)
        if stats is None:
            continue
        if not isinstance(stats, dict):
            raise ResultError(f"'stages_us.{stage}' is not an object")
        stages[stage] = StageStats(
            mean_us=_number(_get(stats, "mean"), f"stages_us.{stage}.mean"),
            p50_us=_opt_number(stats.get("p50"), f"stages_us.{stage}.p50"),
            p99_us=_opt_number(stats.get("p99"), f"stages_us.{stage}.p99"),
        )
    batch_mean = _opt_number(doc.get("batch_size_mean"), "stages_us.batch_size_mean")
    return (stages or None), batch_mean


def parse_load(path: Path, rel: str, doc: dict[str, Any]) -> LoadRun:
    """A ``load`` document as a LoadRun; ResultError names what is missing."""
    latency = _dict(doc, "latency_us", optional=True)  # null when nothing was answered
    stages, batch_mean = _parse_stages(doc.get("stages_us"))
    csv_name = _opt_str(doc.get("csv"))
    csv_path = path.parent / csv_name if csv_name else path.with_suffix(".csv")
    server = _dict(doc, "server", optional=True)
    return LoadRun(
        path=path,
        rel=rel,
        name=_opt_str(doc.get("name")) or path.stem,
        created_utc=_created(doc, path),
        machine=_dict(doc, "machine", optional=True),
        commit=_opt_str(doc.get("commit")),
        server=server,
        load=_dict(doc, "load", optional=True),
        counts=_dict(doc, "counts", optional=True),
        elapsed_s=_number(_get(doc, "elapsed_s"), "elapsed_s"),
        throughput_per_s=_number(_get(doc, "throughput_per_s"), "throughput_per_s"),
        latency_us={key: _number(v, f"latency_us.{key}") for key, v in latency.items() if v is not None},
        stages_us=stages,
        batch_size_mean=batch_mean,
        timeseries=_parse_timeseries(doc.get("timeseries")),
        csv_path=csv_path if csv_path.is_file() else None,
    )


def _parse_matrix_row(row: dict[str, Any], i: int) -> MatrixRow:
    def num(key: str) -> float | None:
        return _opt_number(row.get(key), f"rows[{i}].{key}")

    return MatrixRow(
        queue_type=str(row.get("queue_type", "?")),
        allocator_type=str(row.get("allocator_type", "?")),
        mode=str(row.get("mode", "?")),
        workers=_int(row.get("workers", 0), f"rows[{i}].workers"),
        batch_size=_int(row.get("batch_size", 0), f"rows[{i}].batch_size"),
        load=str(row.get("load", "?")),
        throughput_per_s=_number(_get(row, "throughput_per_s"), f"rows[{i}].throughput_per_s"),
        ratio_to_raw=num("ratio_to_raw"),
        p50_us=num("p50_us"),
        p99_us=num("p99_us"),
        p99_9_us=num("p99_9_us"),
        max_us=num("max_us"),
        compute_mean_us=num("compute_mean_us"),
        errors=_int(row.get("errors", 0), f"rows[{i}].errors"),
        run=_opt_str(row.get("run")),
        lane=_opt_str(row.get("lane")),
        loop_spin_us=_int(row.get("loop_spin_us", 0), f"rows[{i}].loop_spin_us"),
    )


def parse_matrix(path: Path, rel: str, doc: dict[str, Any]) -> MatrixRun:
    """A ``matrix`` document as a MatrixRun; ResultError names what is missing."""
    raw = _dict(doc, "raw", optional=True)
    return MatrixRun(
        path=path,
        rel=rel,
        created_utc=_created(doc, path),
        machine=_dict(doc, "machine", optional=True),
        commit=_opt_str(doc.get("commit")),
        model=str(doc.get("model", "?")),
        raw_throughput_per_s=_opt_number(raw.get("throughput_per_s"), "raw.throughput_per_s"),
        raw_threads=_opt_int(raw.get("threads"), "raw.threads"),
        fixed_rate_per_s=_opt_number(doc.get("fixed_rate_per_s"), "fixed_rate_per_s"),
        saturation_concurrency=_opt_int(doc.get("saturation_concurrency"), "saturation_concurrency"),
        rows=[_parse_matrix_row(row, i) for i, row in enumerate(_rows(doc))],
    )


def _parse_peer_row(row: dict[str, Any], i: int) -> PeerRow:
    def num(key: str) -> float | None:
        return _opt_number(row.get(key), f"rows[{i}].{key}")

    return PeerRow(
        peer=_str(_get(row, "peer"), f"rows[{i}].peer"),
        model=str(row.get("model", "?")),
        concurrency=_int(_get(row, "concurrency"), f"rows[{i}].concurrency"),
        driver=str(row.get("driver", "?")),
        protocol=str(row.get("protocol", "?")),
        throughput_per_s=_number(_get(row, "throughput_per_s"), f"rows[{i}].throughput_per_s"),
        p50_us=num("p50_us"),
        p90_us=num("p90_us"),
        p95_us=num("p95_us"),
        p99_us=num("p99_us"),
        errors=_int(row.get("errors", 0), f"rows[{i}].errors"),
    )


def parse_peers(path: Path, rel: str, doc: dict[str, Any]) -> PeersRun:
    """A ``peers`` document as a PeersRun; ResultError names what is missing."""
    peers = _dict(doc, "peers", optional=True)
    return PeersRun(
        path=path,
        rel=rel,
        created_utc=_created(doc, path),
        machine=_dict(doc, "machine", optional=True),
        commit=_opt_str(doc.get("commit")),
        peers={name: info if isinstance(info, dict) else {} for name, info in peers.items()},
        rows=[_parse_peer_row(row, i) for i, row in enumerate(_rows(doc))],
    )


def _created(doc: dict[str, Any], path: Path) -> str:
    """``created_utc``, else the file's modification time (so every run can be ordered)."""
    created = doc.get("created_utc")
    if isinstance(created, str) and created:
        return created
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return ""
    return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- reading files ----------------------------------------------------------------------------------

Parsed = LoadRun | MatrixRun | PeersRun | ResultFile
_PARSERS: dict[str, Callable[[Path, str, dict[str, Any]], LoadRun | MatrixRun | PeersRun]] = {
    "load": parse_load,
    "matrix": parse_matrix,
    "peers": parse_peers,
}


def read_result(path: Path, root: Path | None = None) -> Parsed:
    """One result file by its kind; ResultError (with the reason) when it cannot be used.

    Files of the older benchmarks carry ``benchmark`` instead of ``kind``; they come back as a
    ResultFile of that kind.
    """
    rel = _relative(path, root)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ResultError(f"cannot read: {e}") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultError(f"not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ResultError(f"not a result file: the JSON is a {type(doc).__name__}, not an object")
    kind = doc.get("kind", doc.get("benchmark"))
    if not isinstance(kind, str) or not kind:
        raise ResultError("not a result file: no 'kind' field")
    parser = _PARSERS.get(kind)
    if parser is None:
        return ResultFile(path=path, rel=rel, kind=kind, created_utc=_created(doc, path))
    try:
        return parser(path, rel, doc)
    except ResultError as e:
        raise ResultError(f"{kind} file: {e}") from e


def _relative(path: Path, root: Path | None) -> str:
    if root is not None:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            pass
    return path.as_posix()


def _newest_first(items: Iterable[Any]) -> list[Any]:
    return sorted(items, key=lambda item: (item.created_utc, item.rel), reverse=True)


def catalog_of(root: Path, files: Iterable[Path]) -> Catalog:
    """Read ``files`` (paths under ``root`` or elsewhere) into a Catalog; bad ones are skipped."""
    found = Catalog(root=root)
    for path in files:
        try:
            parsed = read_result(path, root)
        except ResultError as e:
            found.skipped.append(Skipped(path=path, reason=str(e)))
            continue
        if isinstance(parsed, LoadRun):
            found.loads.append(parsed)
        elif isinstance(parsed, MatrixRun):
            found.matrices.append(parsed)
        elif isinstance(parsed, PeersRun):
            found.peers.append(parsed)
        else:
            found.others.append(parsed)
    found.loads = _newest_first(found.loads)
    found.matrices = _newest_first(found.matrices)
    found.peers = _newest_first(found.peers)
    found.others = _newest_first(found.others)
    return found


def json_files(root: Path) -> list[Path]:
    """Every ``*.json`` file under ``root``, subfolders included (matrix rows live in one); a broken
    link is kept, so that it is reported as unreadable rather than silently missing."""
    return sorted(p for p in root.rglob("*.json") if p.is_file() or p.is_symlink())


def scan(root: str | Path) -> Catalog:
    """Every result file under ``root``. A missing folder is an empty catalog with one skip."""
    root = Path(root)
    if not root.is_dir():
        return Catalog(root=root, skipped=[Skipped(path=root, reason="not a folder")])
    return catalog_of(root, json_files(root))


def folder_signature(root: str | Path) -> tuple[tuple[str, int, int], ...]:
    """Name, size and modification time of every JSON and CSV file under ``root``: changes when a
    result is added or rewritten, so a cache keyed on it rescans exactly when needed."""
    out = []
    for path in sorted(Path(root).rglob("*")):
        if path.suffix in (".json", ".csv"):
            try:
                st = path.stat()
            except OSError:
                continue
            out.append((path.as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(out)


# --- a load run's CSV ---------------------------------------------------------------------------


def _csv_float(text: str | None, column: str, line: int) -> float:
    if text is None or text == "":
        return math.nan
    try:
        return float(text)
    except ValueError:
        raise ResultError(f"line {line}: column {column} is not a number: {text!r}") from None


def load_samples(run: LoadRun) -> LoadSamples:
    """Read a load run's CSV (docs/bench-results.md); ResultError when missing or malformed."""
    if run.csv_path is None:
        raise ResultError(f"{run.rel}: its CSV is not there")
    try:
        with run.csv_path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            columns = set(reader.fieldnames or [])
            missing = {"intended_s", "latency_us", "ok"} - columns
            if missing:
                raise ResultError(f"{run.csv_path.name}: no column {', '.join(sorted(missing))}")
            stage_columns = [s for s in STAGES if f"{s}_us" in columns]
            intended: list[float] = []
            latency: list[float] = []
            ok: list[bool] = []
            stages: dict[str, list[float]] = {s: [] for s in stage_columns}
            for line, row in enumerate(reader, start=2):
                intended.append(_csv_float(row["intended_s"], "intended_s", line))
                latency.append(_csv_float(row["latency_us"], "latency_us", line))
                ok.append(row["ok"] == "1")
                for stage in stage_columns:
                    stages[stage].append(_csv_float(row[f"{stage}_us"], f"{stage}_us", line))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ResultError(f"{run.csv_path.name}: cannot read: {e}") from e
    stage_arrays = {s: np.asarray(v, dtype=np.float64) for s, v in stages.items()}
    return LoadSamples(
        intended_s=np.asarray(intended, dtype=np.float64),
        latency_us=np.asarray(latency, dtype=np.float64),
        ok=np.asarray(ok, dtype=np.bool_),
        stages_us={s: a for s, a in stage_arrays.items() if a.size and not np.isnan(a).all()},
    )
