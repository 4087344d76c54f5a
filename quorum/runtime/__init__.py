"""The asyncio runtime around the pure core: driver loop, aiohttp server and transport, the
key-value state machine and Prometheus metrics."""
