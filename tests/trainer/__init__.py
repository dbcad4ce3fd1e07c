"""The reference trainer and its demo scenarios."""
