from . import optimizer
del optimizer
