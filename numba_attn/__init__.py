"""numba-attn: prototype GPU attention kernels with Numba, one optimization at a time.

The backend (real CUDA or the CUDA simulator) is chosen when this package is
imported, before numba is: see :mod:`numba_attn.backend`.
"""
from .backend import BACKEND, IS_SIMULATOR, describe as describe_backend  # noqa: F401  (first!)
from .problem import PRESETS, Problem  # noqa: F401
from .reference import check, reference  # noqa: F401
from .registry import Launch, get_phase, list_phases, register_phase  # noqa: F401
from .api import attention  # noqa: F401
from .runner import run  # noqa: F401

__version__ = "0.1.0"
