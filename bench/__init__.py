"""Benchmarks: ``python -m bench NAME [ARGS]``; each ``bench/<name>.py`` has ``main(argv)``.

Figures are printed as ratios against a baseline measured in the same run, so they are
comparable across machines; nothing here asserts on time.
"""
