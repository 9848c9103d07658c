"""Placement: the machine's topology (topology.py); the plan and the binding come next (#15)."""
