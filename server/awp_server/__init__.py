"""awp-server: the gRPC transport (WorkerService, ControlService, health, reflection)."""
