"""State: the `Store` protocol; in-memory and Redis (Lua) implementations."""
