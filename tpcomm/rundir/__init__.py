"""The run directory: what every command reads and writes, in one place (docs/run-directory.md).

contract.py   file names and table schemas (columns, kinds, units)
results.py    the typed documents (Attribution, LevelSplit, Verdict, ...) and their JSON
layout.py     RunDir: creating, reading and writing a run directory; meta.json's command log
lock.py       one writer per run directory at a time
safefs.py     writing without following links planted in a shared directory
"""
