"""The example workflow `awp demo` runs: `workflow.yaml` and the Python actions it uses.

Shipped as package data so that `awp demo` works from an installed wheel.
"""
