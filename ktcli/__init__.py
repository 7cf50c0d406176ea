"""ktcli: question answering and summarization over inputs far longer than a model's window."""

__version__ = "0.1.0"
