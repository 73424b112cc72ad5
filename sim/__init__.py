"""Simulation harnesses and the ``ptocube`` command line."""
