import os as _os

# The release gpumem-top's hooks see (they choose history settings by it).
__version__ = _os.environ.get("FAKE_TORCH_VERSION", "2.11.0+cu130")

from . import _C
from . import cuda
from . import optim


class OutOfMemoryError(RuntimeError):
    pass


class _Device:
    def __init__(self, index):
        self.index = index


class _Storage:
    def __init__(self, ptr, nbytes):
        self._ptr, self._nbytes = ptr, nbytes

    def data_ptr(self):
        return self._ptr

    def nbytes(self):
        return self._nbytes


class Tensor:
    """A CUDA tensor as the publisher reads one: its device and storage
    (views share a storage)."""

    def __init__(self, ptr, nbytes, device=0, storage=None, grad=None):
        self.is_cuda = device is not None
        self.device = _Device(device)
        self._storage = storage or _Storage(ptr, nbytes)
        self.grad = grad

    def untyped_storage(self):
        return self._storage
