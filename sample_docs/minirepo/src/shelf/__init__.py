"""shelf: a tiny catalogue for a home library."""

__version__ = "0.3.1"
