"""The tpcomm hook: a vLLM plugin that times every collective inside the serving workers.

Turn it on by installing tpcomm into the server's Python environment and naming
it in VLLM_PLUGINS (one line):

    VLLM_PLUGINS=tpcomm vllm serve MODEL --tensor-parallel-size 8

Then POST /tpcomm/v1/start arms recording, GET /tpcomm/v1/records returns the
records (see routes.py), and `tpcomm.hook.client.HookClient` fetches them into
a run directory. Without VLLM_PLUGINS naming tpcomm nothing is patched.

Modules: plugin.py (worker-side patches), core.py (state and the timed call),
recorder.py (the bounded buffer), timing.py (host timer, CUDA events and
graphs), ops.py (custom ops for torch.compile), rpc.py (worker methods),
routes.py (HTTP), metrics.py (Prometheus text), client.py (fetch into RUN_DIR/hook/).
"""
