"""The ``mixprec`` command of the Python package: the CLI run in this process."""

import signal
import sys

from . import _native


def main() -> None:
    """Runs ``mixprec`` with ``sys.argv`` and exits with its status."""
    # Like the native binary, end quietly when stdout's reader goes away (`mixprec ... | head`).
    # Only here, in a process that exits afterwards: a library caller of ``_native.main`` keeps
    # Python's own disposition (ignored, so a closed pipe is an error, not a killed process).
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(_native.main(sys.argv))


if __name__ == "__main__":
    main()
