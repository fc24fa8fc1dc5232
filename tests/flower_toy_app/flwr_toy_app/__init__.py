"""Minimal Flower app that exercises the tpsl-flwr engines."""
