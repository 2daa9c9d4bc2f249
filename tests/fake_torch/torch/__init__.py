import os as _os

# The release gpumem-top's hooks see (they choose history settings by it).
__version__ = _os.environ.get("FAKE_TORCH_VERSION", "2.11.0+cu130")

from . import _C
from . import cuda
from . import optim
