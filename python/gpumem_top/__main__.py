"""``python -m gpumem_top …``: runs the installed ``gpumem-top`` command."""

import os
import sys

from ._binary import find


def main():
    try:
        path = find()
    except FileNotFoundError as e:
        sys.stderr.write("gpumem-top: %s\n" % e)
        return 2
    if sys.platform == "win32":
        import subprocess

        return subprocess.call([path, *sys.argv[1:]])
    os.execv(path, [path, *sys.argv[1:]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
