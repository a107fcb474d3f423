"""``mi``, mi-core's command line: a ring of mi-core (docs/ARCHITECTURE.md).

Nothing here imports torch or the kernel at module level, so ``mi --help``, ``mi --version`` and
usage errors answer at once; a command imports what it needs when it runs. Commands,
built-in and third-party alike, register through the ``mi_cli`` entry-point group with
:mod:`mi_cli.plugin`.
"""
