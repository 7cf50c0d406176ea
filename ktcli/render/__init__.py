"""Output: Rich status on stderr, plain text or JSON on stdout. Depends on ktcli.types only."""
