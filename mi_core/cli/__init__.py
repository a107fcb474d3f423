"""The ``mi`` command line: core subcommands plus those plugins register."""
