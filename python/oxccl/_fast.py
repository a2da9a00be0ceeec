"""The C++ fast path of the torch backend (`csrc/fast_backend.cpp`).

Compiled once per torch version by `torch.utils.cpp_extension` (needs a C++
compiler and ninja, which the package depends on; about a minute on two
cores) into torch's extension cache (`TORCH_EXTENSIONS_DIR`, default
`~/.cache/torch_extensions`), then loaded from there. `OXCCL_TORCH_FAST=0`
skips it (`verbose` shows the build); any failure to build warns once and
the backend runs every call through its Python path (correct, slower per
call).
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

_SOURCE = Path(__file__).with_name("csrc") / "fast_backend.cpp"


def load():
    """The compiled module, or None (disabled, or it could not be built)."""
    mode = os.environ.get("OXCCL_TORCH_FAST", "1").strip().lower()
    if mode == "0":
        return None
    try:
        import torch
        from torch.utils import cpp_extension

        try:  # ninja from PyPI: put its binary where cpp_extension looks
            import ninja

            if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
                os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        except ImportError:
            pass
        # One build per torch version, source text and place: two
        # installations (a virtual environment, a source tree) must not
        # share a build folder, or each would rebuild over the other.
        key = hashlib.sha1(f"{_SOURCE}\0{_SOURCE.read_text()}".encode()).hexdigest()[:12]
        torch_version = torch.__version__.replace(".", "_").replace("+", "_")
        name = f"oxccl_fast_{torch_version}_{key}"
        return cpp_extension.load(
            name=name,
            sources=[str(_SOURCE)],
            extra_cflags=["-O2"],
            verbose=mode == "verbose",
        )
    except Exception as e:  # noqa: BLE001 - any failure means the Python path
        warnings.warn(
            f"oxccl: the C++ fast path of the torch backend could not be built ({e}); "
            "every call takes the Python path (set OXCCL_TORCH_FAST=0 to skip the attempt)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
