import json
import subprocess
import sys
import time
from pathlib import Path

from tpcomm.tinymodel import generate
from tpcomm.vllm_server import VllmServer

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/trace-capture")
root.mkdir(parents=True, exist_ok=True)
model = root / "model"
if not model.exists():
    generate(model)
prof = root / "prof"
prof.mkdir(exist_ok=True)
cfg = json.dumps({"profiler": "torch", "torch_profiler_dir": str(prof), "torch_profiler_with_stack": False})
srv = VllmServer(
    model=str(model),
    tp=2,
    plugin=True,
    log_path=str(root / "server.log"),
    extra_args=["--profiler-config", cfg],
    extra_env={"VLLM_CACHE_ROOT": str(root / "cache")},
)
t = time.time()
srv.start()
print("started", time.time() - t, flush=True)
try:
    out = root / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpcomm.cli",
            "attribute",
            "--server-url",
            srv.url,
            "--concurrency",
            "1",
            "--requests",
            "4",
            "--input-len",
            "16",
            "--output-len",
            "32",
            "--warmup",
            "1",
            "--max-rounds",
            "1",
            "--profile",
            "--profile-dir",
            str(prof),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    print(r.returncode, r.stdout[-3000:], r.stderr[-3000:])
finally:
    srv.stop()
