"""Preparing the packaged model on a cold cache from several processes at once.

tritonserver loads a repository's Python models side by side, and each resolves the model, so
on a fresh clone several stub processes ask for the same conversion at the same moment. This
runs three real processes against an empty cache, each then loading the tokenizer and model
config with transformers (not tritonforge) from the folder it was given.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
from pathlib import Path
go = Path(sys.argv[1])
Path(sys.argv[2]).touch()  # imported and at the gate
while not go.exists():
    time.sleep(0.01)
from tritonforge.runtime.models import resolve_model
folder = resolve_model("package:smollm2-135m-instruct")
import transformers
tok = transformers.AutoTokenizer.from_pretrained(str(folder))
cfg = transformers.AutoConfig.from_pretrained(str(folder))
print(json.dumps({"folder": str(folder), "inode": os.stat(folder / "config.json").st_ino,
                  "ids": tok("The capital of France")["input_ids"], "vocab": cfg.vocab_size}))
"""


def test_concurrent_first_preparation_converts_once_and_every_process_loads(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    go = tmp_path / "go"
    env = {**os.environ, "TRITONFORGE_CACHE": str(cache)}
    ready = [tmp_path / f"ready-{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(go), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in ready]
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready):  # all three at the gate, then released together
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a process died before the gate"
        time.sleep(0.05)
    go.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, f"a process failed to get a usable model folder:\n{err[-3000:]}"
        outs.append(json.loads(out.strip().splitlines()[-1]))
    assert len({o["folder"] for o in outs}) == 1
    # one conversion stood: every process read the same config.json, not one replaced under it
    assert len({o["inode"] for o in outs}) == 1
    assert all(o["ids"] == outs[0]["ids"] and o["ids"] for o in outs)
    assert outs[0]["vocab"] > 1000
    models = cache / "models"
    left = sorted(p.name for p in models.iterdir() if p.is_dir())
    assert left == [Path(outs[0]["folder"]).name], f"leftover temporary folders: {left}"
