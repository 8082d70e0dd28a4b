"""The core: the writer (group commit), the commands that plan writes, the fold, and what
a request carries (its caller's grants, its page budget)."""
