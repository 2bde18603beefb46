"""The loop and what it needs: sequences and sessions, drafters, the escalation gate, the cloud's
verdicts, acceptance policies, constraints and traces. Nothing here loads a model
(specdec/models/ does; specdec/engine.py puts them together)."""
