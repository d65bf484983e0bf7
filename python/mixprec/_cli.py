"""The ``mixprec`` command of the Python package: the CLI run in this process."""

import sys

from . import _native


def main() -> None:
    """Runs ``mixprec`` with ``sys.argv`` and exits with its status."""
    sys.exit(_native.main(sys.argv))


if __name__ == "__main__":
    main()
