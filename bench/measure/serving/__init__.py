"""One server under many clients: a fleet of edges and cloud-only clients per size (fleet.py, fleet_config.py,
fleet_edge.py) and the soak under faults (soak.py, soak_edge.py), both speaking the protocol through clients.py.
"""
