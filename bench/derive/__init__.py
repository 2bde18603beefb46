"""What is computed from raw records afterwards: rates and intervals, per-point and per-fleet summaries, text
health, scores, the capacity model, the verdict. Imports only core.
"""
