"""`ktcli serve`: the local engine behind an OpenAI-compatible HTTP API."""
