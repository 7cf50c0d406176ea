"""Executes a Plan: the only package that imports both the engine and retrieval."""
