"""Serving: the process (assembly, start, reload, drain), the socket and HTTP faces, the
method table, config, metrics, systemd and logs."""
