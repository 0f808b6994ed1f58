"""The Litestar gateway (docs/protocol.md)."""
