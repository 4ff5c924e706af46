"""Storage layer of AWP: every SQL statement and transaction lives in this package.

One module per aggregate (workflows, runs, workers, leases, coordination), each
running named queries from `sql/<aggregate>.sql`.
"""
