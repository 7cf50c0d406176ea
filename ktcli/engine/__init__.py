"""Generation backends. The engine knows tokens, never documents."""
