"""oxccl from Python.

``import oxccl`` registers the ``torch.distributed`` backend ``"oxccl"``
(when torch is installed), so that::

    import oxccl, torch.distributed as dist
    dist.init_process_group("oxccl")          # under torchrun
    dist.all_reduce(t)                        # CPU tensors

runs PyTorch's collectives on oxccl. The communicator itself
(:class:`Comm`, on raw addresses) is here for other bindings.
"""

from ._oxccl import CallWork, Comm, CommError, UniqueIdHandle

__all__ = ["CallWork", "Comm", "CommError", "UniqueIdHandle", "BACKEND"]

#: The name to pass to ``torch.distributed.init_process_group``.
BACKEND = "oxccl"

try:
    import torch.distributed as _dist
except ImportError:  # no torch: the raw communicator still works
    _dist = None

if _dist is not None and _dist.is_available():
    from ._torch import OxcclBackend, OxcclError, register

    register()
    __all__ += ["OxcclBackend", "OxcclError"]
