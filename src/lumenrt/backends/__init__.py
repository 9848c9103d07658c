"""Backends: ONNX Runtime, XGBoost, PyTorch and plain Python, behind one interface (base.py)."""

from lumenrt.backends.base import REGISTRY, Backend, BackendSession, Placement, get_backend, register

__all__ = ["REGISTRY", "Backend", "BackendSession", "Placement", "get_backend", "register"]
