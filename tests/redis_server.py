"""The tests' redis-server: a real one (see fairgate.bench.redis_local), never a fake."""

from fairgate.bench.redis_local import RedisServer, find_redis_server, free_port

__all__ = ["RedisServer", "find_redis_server", "free_port"]
