from . import _C
from . import cuda
from . import optim
