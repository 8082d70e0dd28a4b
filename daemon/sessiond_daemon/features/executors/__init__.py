"""Background executors: session.spawn and the turns, processes and recovery behind it."""
