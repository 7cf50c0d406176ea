"""`python -m ktcli`: the same as the `ktcli` command (a venv without its scripts on PATH)."""

from ktcli.cli.app import main

main()
