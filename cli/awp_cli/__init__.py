"""awp: the user and operator CLI of AWP (workflows, runs, workers, stats, `awp dev`)."""
