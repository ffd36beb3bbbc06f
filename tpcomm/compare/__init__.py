"""`tpcomm compare RUN_A RUN_B`: what a change did to each token, term by term, and whether it is real.

    analysis.py    compare_runs(A, B) -> results.Comparison: pairs the levels, hands off to the modules below
    runs.py        the two run directories, loaded through the contract; the one-line refusals
    samples.py     one level of one run as it is resampled: attribute's own decode pairs, in blocks
    intervals.py   block bootstrap per repeat, the spread between repeats, one simultaneous band per level
    levels.py      one level's B - A per statistic with its interval and statement; the sites side by side
    conditions.py  what differs between the runs' conditions; the model identity
    model.py       two predictions (predict.json) side by side, model-based
    verdict.py     the verdict line and the --fail-if-slower gate
    tables.py      the column specs and report blocks (PDF, Markdown and terminal draw the same)
    show.py, cli.py  the terminal and the command; tpcomm/compare/page.py draws the PDF

Reference: docs/compare.md.
"""
