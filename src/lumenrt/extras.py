"""lumenrt's optional parts (pip extras) and the one check that a command's extra is installed.

``pip install lumenrt`` gives the server, the load generator, the demo and the built-in models.
Each extra in pyproject.toml (``[project.optional-dependencies]``) adds what one side part needs.
Code that needs an extra calls ``require`` before it imports anything from it, so a missing one is
answered with one line naming the extra (``cli.py`` prints it after the command's name and exits 2):

    lumenrt dashboard: needs the 'dashboard' extra: pip install 'lumenrt[dashboard]'

Modules of an extra are imported only inside the functions that use them, never at the top of a
module that the ``lumenrt`` command line or the server imports.
"""

import importlib.util

# The import names each runtime extra provides (pyproject.toml lists their distributions; the
# test and dev extras are tools, never imported by lumenrt; the bench extra serves a checkout's
# benchmarks/queues.py and grpc_floor.py, not the package).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "bench": ("faster_fifo", "zmq", "h2"),  # benchmarks/queues.py, grpc_floor.py (skipped without)
    "dashboard": ("streamlit", "plotly"),  # `lumenrt dashboard`; plotly alone: `lumenrt bench report`
    "torch": ("torch",),  # the PyTorch backend
    "gpu": ("pynvml",),  # nvidia-ml-py: NVML figures of GPU instances (engine/gpu/torch_device.py)
    # `lumenrt serve --trace`: OpenTelemetry spans over OTLP/HTTP (observability/tracing.py)
    "trace": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
}


class MissingExtra(Exception):
    """An extra that is not installed; the message says how to install it."""

    def __init__(self, extra: str, modules: tuple[str, ...]) -> None:
        self.extra = extra
        self.modules = modules  # those of its modules that are missing
        super().__init__(f"needs the {extra!r} extra: pip install 'lumenrt[{extra}]'")


def is_installed(module: str) -> bool:
    """Whether a module can be imported, without importing it (a dotted name imports its parent
    packages, which for an extra's namespace package such as ``opentelemetry`` is nothing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: in sys.modules with no __spec__
        return False


def require(extra: str, *modules: str) -> None:
    """Raise ``MissingExtra`` unless each module (default: every one the extra provides) is installed."""
    missing = tuple(m for m in modules or EXTRA_MODULES[extra] if not is_installed(m))
    if missing:
        raise MissingExtra(extra, missing)


def extra_providing(module: str) -> str | None:
    """The extra that provides a module or one of its submodules (``plotly.subplots``: dashboard)."""
    top = module.partition(".")[0]
    return next(
        (
            extra
            for extra, provided in EXTRA_MODULES.items()
            if top in {m.partition(".")[0] for m in provided}
        ),
        None,
    )
