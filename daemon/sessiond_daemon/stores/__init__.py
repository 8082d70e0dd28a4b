"""The stores: the interface every store implements (interface.py), the read models
defined once for all of them (models/), the registry that names them (registry.py), and
the stores themselves (sqlite/, postgres/)."""
