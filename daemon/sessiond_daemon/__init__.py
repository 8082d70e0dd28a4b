"""The sessiond daemon: event store, fold, writer and JSON-RPC server."""
