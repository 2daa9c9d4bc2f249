"""Finds the ``gpumem-top`` binary the wheel installed beside Python."""

import os
import shutil
import sys
import sysconfig

_NAME = "gpumem-top" + (".exe" if sys.platform == "win32" else "")


def find():
    """The installed ``gpumem-top``: this environment's scripts directory,
    the user scheme's (``pip install --user``), then ``PATH``."""
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [sysconfig.get_path("scripts")]
    try:
        scheme = sysconfig.get_preferred_scheme("user")
        candidates.append(sysconfig.get_path("scripts", scheme))
    except Exception:
        pass
    # A --target or --prefix install: bin/ beside the site-packages tree.
    candidates.append(os.path.join(here, "..", "..", "..", "..", "bin"))
    for d in candidates:
        if d:
            p = os.path.join(d, _NAME)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return os.path.realpath(p)
    p = shutil.which(_NAME)
    if p:
        return p
    raise FileNotFoundError("the gpumem-top command is not installed beside this Python (pip install gpumem-top)")
