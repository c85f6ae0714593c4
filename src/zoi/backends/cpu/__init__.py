"""The native CPU backend (zoi._cpu, C++): `CpuBackend` lives in backend.py."""

from zoi.backends.cpu.backend import CpuBackend

__all__ = ["CpuBackend"]
