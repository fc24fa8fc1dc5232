"""TPSL example: three non-label parties, one of them categorical-only."""
