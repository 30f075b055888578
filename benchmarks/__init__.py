"""Benchmarks of aaa_celery: overhead, takeover, scale, engine (see README.md)."""
