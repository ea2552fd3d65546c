"""Seeded renderers of text scenes with their truth, taken by the demo and the benchmarks.

`text` draws what a line says; `clips` renders the hard clips (Hershey fonts), `scenarios`
the ten camera scenarios (Hershey and TrueType), `stills` the OCR benchmark's stills.
"""
