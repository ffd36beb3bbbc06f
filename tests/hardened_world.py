"""The session's keyed server (conftest.hardened_server): what it needs before it starts, and its key.

Plugin on and switched on by TPCOMM_HOOK=1 with VLLM_PLUGINS unset, --api-key, its metrics folder in a
world-writable stand-in for /dev/shm where another user (uid 65534) took the folder name before it started, a
marker plugin on PYTHONPATH (other vLLM plugins still load), records paged 1000 rows at a time, the routes'
worker timeout 8 s, the hook's test-only faults and vLLM's dev routes on. One variant serves every keyed test
(test_hook_server's, test_attribute_server's, test_hardening_server's, test_shutdown_server's): each used to
start a keyed server of its own, ~45 s apiece on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from other_user import as_nobody, skip_reason

KEY = "sekret-hardened"
H = {"Authorization": f"Bearer {KEY}"}
MARKER_PLUGIN = """
import os
def register():
    d = os.environ.get("TPCOMM_TEST_MARKS")
    if d:
        open(os.path.join(d, str(os.getpid())), "w").close()
"""


def make_world(tmp_path_factory) -> dict:
    """Folders the server needs before it starts: a stand-in /dev/shm the other user has written to, the
    marker plugin on PYTHONPATH, the folder the marker plugin marks."""
    shm = Path(tempfile.mkdtemp(prefix="tpcomm-shm-"))
    shm.chmod(0o1777)
    squat = shm / f"tpcomm-{os.geteuid()}"
    if skip_reason() is None:
        as_nobody(os.mkdir, str(squat), 0o777)  # the other user took the worker's folder name first
    plug = tmp_path_factory.mktemp("plugin")
    (plug / "tpcomm_test_marker").mkdir()
    (plug / "tpcomm_test_marker" / "__init__.py").write_text(MARKER_PLUGIN)
    dist = plug / "tpcomm_test_marker-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tpcomm-test-marker\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\ntest_marker = tpcomm_test_marker:register\n")
    marks = tmp_path_factory.mktemp("marks")
    return {"shm": shm, "squat": squat, "plugin": plug, "marks": marks}


def remove_world(world: dict) -> None:
    shutil.rmtree(world["shm"], ignore_errors=True)


def server_env(world: dict) -> dict:
    return {
        "TPCOMM_METRICS_DIR": str(world["shm"]),
        "TPCOMM_RPC_TIMEOUT_S": "8",
        "TPCOMM_RECORDS_PAGE_ROWS": "1000",
        "PYTHONPATH": str(world["plugin"]),
        "TPCOMM_TEST_MARKS": str(world["marks"]),
        "TPCOMM_HOOK_TEST_FAULTS": "1",  # test_hook_server's injected fault (its last test on this server)
    }
