"""One module per judgement, used by attribute, predict and report alike: bottleneck.py (is the interconnect
the bottleneck), levers.py (what to set, and what it would do), definitions.py (the one-line definitions the
outputs print, built from the constants the judgements use)."""
