"""``python -m mixprec``: the ``mixprec`` command."""

from ._cli import main

main()
