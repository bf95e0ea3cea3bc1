"""A deterministic toy training loop that uses the runtime the way a PyTorch loop would.

State: a running checksum over every step's "gradient" (a function of the step number only), so
the final state equals an uninterrupted run only if every step ran exactly once after resuming.
Progress goes to a file so the test knows when to interrupt.
"""
import json
import os
import sys

from constructs_lib.runtime import Checkpointer
from constructs_lib.runtime.config import resolve_config
from constructs_lib.runtime.resume import restore
from constructs_lib.runtime.store import CheckpointStore

STEPS, EVERY = int(sys.argv[1]), int(sys.argv[2])
progress = sys.argv[3]
cfg = resolve_config(use_imds=False)
store = CheckpointStore(cfg.bucket, cfg.prefix)

# What the boot-time restore unit does before the job starts.
restore(store, cfg.local_dir)

ckpt = Checkpointer(cfg.local_dir, upload=lambda step, path: store.push(path, step))
state, start = 0, 0
if ckpt.resume_path:
    with open(os.path.join(ckpt.resume_path, "state.json")) as f:
        saved = json.load(f)
    state, start = saved["state"], saved["step"] + 1

for step in range(start, STEPS):
    state = (state * 31 + step * step + 7) % 1_000_000_007
    with open(progress, "a") as f:
        f.write(f"{step}\n")
    if ckpt.should_checkpoint(step, every=EVERY) or step == STEPS - 1:
        with ckpt.save(step) as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"step": step, "state": state}, f)
            with open(os.path.join(d, "weights.bin"), "wb") as f:
                f.write(state.to_bytes(8, "little") * 4096)
        ckpt.wait_for_uploads()
print(json.dumps({"final": state}))
