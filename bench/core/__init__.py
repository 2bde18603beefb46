"""What every layer shares: what identifies a result (point), which way a metric moves, the raw records and the
results folder, the inputs (prompts, audio) and the network profiles. Imports nothing else in bench.
"""
