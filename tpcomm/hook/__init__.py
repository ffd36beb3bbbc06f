"""The tpcomm hook: a vLLM plugin that times every collective inside the serving workers.

Turn it on by installing tpcomm into the server's Python environment and
switching it on (one line; switch.py says why not VLLM_PLUGINS, an allow-list):

    TPCOMM_HOOK=1 vllm serve MODEL --tensor-parallel-size 8

Then POST /tpcomm/v1/start arms recording, GET /tpcomm/v1/records returns the
records (see routes.py), and `tpcomm.attribute.hook_client.HookClient` fetches them into
a run directory. Without TPCOMM_HOOK=1 (or VLLM_PLUGINS naming tpcomm) nothing
is patched.

Modules: plugin.py (worker-side patches), failsafe.py (the one wrapper every patch goes
through: vLLM's call runs whatever tpcomm's part does; TPCOMM_FAULT), core.py (state and the timed call),
recorder.py (the bounded buffer), timing.py (host timer, CUDA events and
graphs), ops.py (custom ops for torch.compile), rpc.py (worker methods),
routes.py (HTTP), metrics.py (Prometheus text), client.py (fetch into RUN_DIR/hook/).
"""
