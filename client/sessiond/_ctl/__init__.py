"""sessionctl\x27s commands, each declared with its arguments next to its handler."""
