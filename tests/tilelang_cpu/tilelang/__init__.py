"""A CPU stand-in for the `tilelang` package, for tests only: enough of `tilelang.language` to run
the TileLang modules cleave emits, element by element, in Python (see `language.py`)."""
