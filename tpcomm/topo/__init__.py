"""`tpcomm topo`: GPUs, links, P2P, NUMA, NCCL env and vLLM eligibility (see collect.py)."""
