"""Command-line interface: one small module per command, dispatched from ``main``."""
