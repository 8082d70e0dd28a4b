"""The stores: the interface every store implements, the read models defined once for
all of them (models/), the registry that names them (registry.py), and (to come) the
stores themselves."""
