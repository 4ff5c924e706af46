"""Pieces every AWP process shares: structured logging, settings from flags and the
environment, and the duration text flags and workflow files both accept."""
