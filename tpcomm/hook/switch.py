"""How the operator switches the hook on, without losing their other vLLM plugins.

VLLM_PLUGINS is an allow-list in vLLM 0.32 (vllm/plugins/__init__.py): unset, vLLM loads every installed
general, platform and stat-logger plugin but no endpoint plugin; set, it loads only the plugins it names, in
every group. `VLLM_PLUGINS=tpcomm` therefore silently drops every other plugin the server had (vLLM's own
LoRA resolvers included). So tpcomm has its own switch:

    TPCOMM_HOOK=1 vllm serve MODEL ...          (VLLM_PLUGINS unset: every plugin loads as before)

With VLLM_PLUGINS unset vLLM runs tpcomm's general plugin in every process anyway (it patches nothing unless
switched on); with TPCOMM_HOOK=1 it installs the hook, and in the API server adds tpcomm's endpoint plugin
(the /tpcomm/v1 routes) to what vLLM's endpoint loader returns, which without VLLM_PLUGINS is nothing: vLLM
gates endpoint plugins on the allow-list because they add HTTP routes, and TPCOMM_HOOK=1 is the operator's
explicit consent to these ones (they answer only with the server's API key when it has one).
`VLLM_PLUGINS=tpcomm,<the others>` still works: a server that sets VLLM_PLUGINS must list tpcomm in it (vLLM
then never runs tpcomm's code, so TPCOMM_HOOK alone cannot act).
"""

from __future__ import annotations

import os

SWITCH = "TPCOMM_HOOK"


def named_in_vllm_plugins() -> bool:
    return "tpcomm" in [p.strip() for p in os.environ.get("VLLM_PLUGINS", "").split(",")]


def switched_on() -> bool:
    return named_in_vllm_plugins() or os.environ.get(SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def attach_routes_without_allowlist() -> None:
    """With VLLM_PLUGINS unset, have vLLM's endpoint loader (called once, in the API server) return tpcomm's
    endpoint plugin. Imports nothing heavy until that call: this runs in every vLLM process. Through
    failsafe.patch (site `routes`): whatever goes wrong here, vLLM's loader answers as it would have."""
    if named_in_vllm_plugins():
        return  # vLLM loads the endpoint plugin itself
    import vllm.plugins as vp

    from tpcomm.hook import failsafe

    if getattr(vp.load_endpoint_plugins, "_tpcomm_original", None) is not None:
        return
    failsafe.patch(vp, "load_endpoint_plugins", "routes", _add_routes, replaces=True)


def _add_routes(call, supported_tasks=None):
    """vLLM's loader with VLLM_PLUGINS unset returns no endpoint plugin (and warns that tpcomm's needs the
    allow-list): tpcomm's routes instead, the operator's TPCOMM_HOOK=1 being the consent. Set after all (an
    allow-list): vLLM's loader decides."""
    import vllm.envs as envs

    if envs.VLLM_PLUGINS is not None:
        return call(supported_tasks)
    from tpcomm.hook.core import logger
    from tpcomm.hook.routes import make_plugin

    plugin = make_plugin()
    logger.info("tpcomm: /tpcomm/v1 routes added (TPCOMM_HOOK=1; VLLM_PLUGINS unset, other plugins load as usual)")
    return [plugin]
