"""API generations: wire adapters and negotiation."""
