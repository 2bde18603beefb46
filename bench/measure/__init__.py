"""What measures: runs, sweeps and their workers, fleets, links, the gate's workload, profiles. Imports core
and derive; never read or commands.
"""
