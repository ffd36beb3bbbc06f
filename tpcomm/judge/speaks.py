"""The one rule for which measured level a headline or a verdict speaks of: the lowest concurrency among the
levels that measured the figure and are complete (judge/complete.py), its median repeat by that figure.

attribute's headline (the split's engine time per token), the report's client-only headline (TPOT p50 when
there is no split), compare's verdict (B - A per token) and the report's replay-vs-serving comparison all
ask this function; each says what its figure is and how a level is incomplete, none re-implements the rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def level_that_speaks(
    levels: Iterable[T],
    *,
    concurrency: Callable[[T], int],
    figure: Callable[[T], float | None],
    incomplete: Callable[[T], str | None],
) -> T | None:
    """The lowest concurrency with a figure (not None) and no reason to be incomplete; of its repeats the
    median by figure (the upper of two). None when no level qualifies."""
    eligible = [x for x in levels if figure(x) is not None and not incomplete(x)]
    if not eligible:
        return None
    c = min(concurrency(x) for x in eligible)
    reps = sorted((x for x in eligible if concurrency(x) == c), key=figure)
    return reps[len(reps) // 2]
