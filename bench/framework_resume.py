"""Steps a framework's own script loses on spot, with and without dl-launcher's one-line callback,
in the test suite's drill (2 nodes x 2 ranks, real torchrun on gloo, the node bundle, moto_server,
a fake IMDS per node on 127.0.0.x), the script shipped unmodified with -c checkpoint_dir=.

For each framework (Hugging Face Trainer, Lightning) and each way (with --callback, without):
- a hard kill of the node running global rank 0, mid-run: steps done before the kill that the
  next generation does again (its resume step is the newest save that reached S3);
- a termination notice on the other node, AWS taking it at the notice's deadline: steps done
  in that generation that the next one does again.
The save interval is --every steps; a step takes about --sleep seconds plus the model's time.

    python bench/framework_resume.py [--every 8] [--sleep 0.25] [--only hf] [--ways without]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
for _k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # moto_server's stand-ins, never real ones
    os.environ.setdefault(_k, "testing")
from tests.runtime.drill import Drill, generations, start_moto_server  # noqa: E402

PROJECT = ROOT / "tests" / "runtime" / "framework_project"
COMMANDS = {"hf": ("outputs", "hf_train.py --output-dir outputs"),
            "lightning": ("checkpoints", "lightning_train.py --ckpt-dir checkpoints")}


def _max_step(d: Drill, g: str) -> int:
    return max((e["step"] for e in d.read_events() if e["gen"] == g and e["event"] == "step"), default=-1)


def _next_gen(d: Drill, after: str) -> str:
    d.wait("the next generation", lambda: (d.current_gen() or after) != after
           and len(generations(d.read_events())[d.current_gen()]["starts"]) == d.nodes * d.nproc, timeout=300)
    return d.current_gen()


def run(framework: str, callback: bool, every: int, sleep: float, root: Path, endpoint: str) -> dict:
    ckdir, script = COMMANDS[framework]
    root.mkdir()
    steps = 100 * every  # never done before the notice's deadline: the job must still be training then
    d = Drill(root, endpoint, steps=steps, code=PROJECT, job=f"{framework[:3]}-{int(callback)}",
              context={"checkpoint_dir": ckdir},
              job_command=f"dl-torchrun {script} --max-steps {steps} --save-steps {every} --sleep {sleep} "
                          f"--events {root / 'events.jsonl'}" + (" --callback" if callback else ""))
    try:
        d.add_node("127.0.0.2")
        d.add_node("127.0.0.3")
        d.wait("training past two saves", lambda: d.running("1", 2 * every + every // 2), timeout=300)
        rank0 = next(n for n in d.all_nodes if n.id == d.plan("1")["members"][0]["node"])
        rank0.kill()
        done = _max_step(d, "1")
        d.add_node("127.0.0.4")
        g2 = _next_gen(d, "1")
        kill_lost = done - min(generations(d.read_events())[g2]["starts"].values())
        start = min(generations(d.read_events())[g2]["starts"].values())
        d.wait("progress", lambda: d.running(g2, start + every + every // 2), timeout=300)
        warned = next(n for n in d.live() if n.id != d.plan(g2)["members"][0]["node"])
        deadline = warned.imds.interrupt(seconds=20)
        # AWS takes the node at the deadline, whether or not the job stopped for it.
        while time.time() < deadline.timestamp() and "left the cluster" not in warned.log_text():
            time.sleep(0.2)
        warned.kill()
        done = _max_step(d, g2)
        d.add_node("127.0.0.5")
        g3 = _next_gen(d, g2)
        notice_lost = done - min(generations(d.read_events())[g3]["starts"].values())
        return {"kill": kill_lost, "notice": notice_lost}
    finally:
        d.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--every", type=int, default=8, help="the framework's save interval, in steps")
    p.add_argument("--sleep", type=float, default=0.25, help="seconds each step sleeps")
    p.add_argument("--only", choices=sorted(COMMANDS), default=None)
    p.add_argument("--ways", choices=("both", "with", "without"), default="both", help="with or without the callback")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp())
    server, endpoint = start_moto_server(work / "moto.log")
    try:
        print(f"save every {args.every} steps, {args.sleep} s/step slept; steps done again after:")
        for fw in [args.only] if args.only else sorted(COMMANDS):
            for cb in {"both": (True, False), "with": (True,), "without": (False,)}[args.ways]:
                got = run(fw, cb, args.every, args.sleep, work / f"{fw}-{int(cb)}", endpoint)
                print(f"  {fw:<9} {'with' if cb else 'without':<7} callback: hard kill of rank 0's node "
                      f"{got['kill']:>3}, notice {got['notice']:>3}", flush=True)
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
