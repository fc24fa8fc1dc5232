"""Flower wiring: ServerApp/ClientApp, engines, experiment configs and the CLI."""
