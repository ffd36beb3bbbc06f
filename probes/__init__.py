"""Rank-side collective probes. Imports only torch (and vLLM for vLLM's own
backends), so a file here runs on a cluster node by hand:

    torchrun --nproc-per-node 2 probes/collectives.py --backend gloo --sizes 14336 --out /tmp/p

See probes/collectives.py for the spec format and the result records.
"""
