"""The stores: the interface every store implements, the read models defined once for
all of them (models/), and (to come) the stores themselves."""
