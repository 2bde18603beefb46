"""What measures: runs, sweeps and their workers (sweep/), fleets and the soak (serving/), the peers (peers/),
links, the gate's workload, profiles. Imports core and derive; never read or commands.
"""
