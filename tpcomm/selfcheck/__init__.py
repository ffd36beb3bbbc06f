"""`tpcomm selfcheck`: one command, torch only, that checks on whatever GPUs exist
(or on the CPU) the paths a first real run depends on, and prints PASS / FAIL /
SKIP per item with its figure and conditions. Exit 0 iff nothing FAILed.

    result.py   a check's outcome, the pure judges (figure -> PASS/FAIL), formatting
    cuda.py     CUDA-event timer (eager, in a graph on another stream, sampled), event overhead in graphs, NVML
    hookpath.py the hook's `timed` path on a stand-in group (CUDA events, or the host clock on CPU)
    procs.py    checks in other processes: fork safety, probe ops at world size 1, rank refusal, 2+ GPU backends
    run.py      the list of checks, what each needs, and the run
"""
