"""Pieces every AWP process shares: structured logging and flag/environment parsing."""
