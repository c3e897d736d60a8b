"""coeffd subcommands, one module each."""
