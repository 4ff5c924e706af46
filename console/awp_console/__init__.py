"""awp console: a web view of runs, workflows, workers and the reliability figures."""
