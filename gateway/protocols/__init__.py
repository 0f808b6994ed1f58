"""Providers' wire formats over the native protocol (bridge.py): ElevenLabs (elevenlabs.py) and Cartesia
(cartesia.py), so their clients switch to voxgate by changing one URL (docs/elevenlabs.md, docs/cartesia.md)."""
