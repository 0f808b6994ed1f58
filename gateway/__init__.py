"""The Litestar gateway (DESIGN §5)."""
