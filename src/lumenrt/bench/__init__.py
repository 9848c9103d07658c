"""Benchmarks of lumenrt's native core, runnable as ``lumenrt bench <name>``.

Each benchmark reports what it measured on this machine and writes a result file (see
:mod:`lumenrt.bench.results`); none of them judges the numbers.
"""
