"""Fleet mode: the PostgreSQL store (docs/fleet.md).

`dsn` (URL checks, the password) imports nothing beyond the standard library, so the
config can use it without asyncpg installed; `schema`, `store` and `listener` need
asyncpg (the `fleet` extra).
"""
