"""The core: the writer (group commit), the commands that plan writes, and the fold."""
