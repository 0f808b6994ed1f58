"""Streaming text segmentation: when is text from an LLM safe to speak (DESIGN §2)."""
