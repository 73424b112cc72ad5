"""Amaranth hardware of the CUBE unit: decoder, preflight, systolic engine, img2col, top level."""
