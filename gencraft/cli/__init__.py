"""Command-line interface (``gencraft --help``)."""
