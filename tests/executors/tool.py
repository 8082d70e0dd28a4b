"""Fake executors that misbehave or speak sessiond's own events: `python tool.py MODE [ARGS]`."""
import json
import os
import signal
import subprocess
import sys
import time

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "executors")


def out(line: str) -> None:
    print(line, flush=True)


mode, args = sys.argv[1], sys.argv[2:]
if mode == "jsonl":
    # The task (turn 1) or the injected message (later turns) comes on stdin.
    text = sys.stdin.read().strip()
    out(json.dumps({"type": "message.appended",
                    "data": {"role": "assistant", "content": f"got: {text}"}}))
    if os.environ.get("SESSIOND_TURN") == "1":
        with open(os.path.join(FIXTURES, "jsonl_turn.jsonl")) as f:
            for line in f.read().splitlines():
                out(line)
    print("fake jsonl executor: done", file=sys.stderr, flush=True)
elif mode == "fail":
    out("starting")
    print("boom: something went wrong", file=sys.stderr, flush=True)
    sys.exit(3)
elif mode == "stubborn":
    # Ignores SIGTERM, and so does its child: only SIGKILL to the group ends them.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c",
                              "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
                              " time.sleep(120)"])
    out(json.dumps({"child": child.pid}))
    time.sleep(120)
elif mode == "flood":
    count, long_bytes = int(args[0]), int(args[1])
    for i in range(count):
        sys.stdout.write(f"line {i}\n")
    sys.stdout.write("x" * long_bytes + "\n")
    sys.stdout.write("last line without a newline")
elif mode == "slow":
    count, interval = int(args[0]), float(args[1])
    for i in range(count):
        out(f"tick {i}")
        time.sleep(interval)
elif mode == "quiet":
    for i in range(3):
        out(f"hello {i}")
    time.sleep(120)
elif mode == "leftover":
    # Exits at once, leaving a child that holds stdout open.
    child = subprocess.Popen(["sleep", "120"])
    out(json.dumps({"child": child.pid}))
else:
    sys.exit(f"unknown mode {mode}")
