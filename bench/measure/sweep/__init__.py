"""The sweep: its grid and settings (sweep_config.py), run in capped worker processes (worker.py) on this
machine (sweep.py) or as Ray tasks (cluster.py, its overhead measured by cluster_overhead.py).
"""
