"""Starts N processes of one command on this machine as one run's process group (like
`torchrun`): each gets `JAX_COORDINATOR_ADDRESS` (a free loopback port), `JAX_NUM_PROCESSES` and
its `JAX_PROCESS_ID`, which `tlt_jax.distributed.initialize` reads. Their output is forwarded
line by line with a `[pI]` prefix; if one process fails, the others are stopped and its exit
status is returned.

  python -m experiments.launch_local --num_processes=2 -- \\
      python -m experiments.train_grpo --config=experiments/configs/tiny_tlt.py:small
On CPU, `--devices_per_process=K` gives each process K fake devices.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from experiments import fake_devices, launch

_NUM = flags.DEFINE_integer("num_processes", 2, "processes to start", lower_bound=1)
_DEVICES = flags.DEFINE_integer("devices_per_process", 0,
                                "CPU only: fake devices per process (0: as the environment says)")
_GRACE_S = flags.DEFINE_float("grace_s", 10.0, "seconds between SIGTERM and SIGKILL on failure")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def process_env(i: int, n: int, port: int, devices: int) -> dict:
  """The environment of process `i` of `n`."""
  env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(n),
             JAX_PROCESS_ID=str(i), PYTHONUNBUFFERED="1")
  if devices:
    env["XLA_FLAGS"] = fake_devices.xla_flags(devices, env.get("XLA_FLAGS", ""))
  return env


def _forward(i: int, stream) -> None:
  for line in iter(stream.readline, b""):
    sys.stdout.write(f"[p{i}] {line.decode(errors='replace')}")
    sys.stdout.flush()


def stop(procs, grace_s: float) -> None:
  """SIGTERM to every live process, SIGKILL to those still alive after `grace_s`."""
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  for p in procs:
    try:
      p.wait(max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()


def launch_all(command: list[str], n: int, devices: int = 0, grace_s: float = 10.0) -> int:
  """Runs `command` as `n` processes; returns 0 if all succeed, else the first failure's status."""
  port = free_port()
  procs = [subprocess.Popen(command, env=process_env(i, n, port, devices), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT) for i in range(n)]
  threads = [threading.Thread(target=_forward, args=(i, p.stdout), daemon=True)
             for i, p in enumerate(procs)]
  for t in threads:
    t.start()
  status = 0
  try:
    while any(p.poll() is None for p in procs):
      failed = [p for p in procs if p.poll() not in (None, 0)]
      if failed:
        status = failed[0].returncode
        print(f"[launch_local] process {procs.index(failed[0])} exited with status {status}; "
              "stopping the others", flush=True)
        break
      time.sleep(0.2)
  finally:
    stop(procs, grace_s)
    for t in threads:
      t.join(timeout=5)
  status = status or next((p.returncode for p in procs if p.returncode), 0)
  return 128 - status if status < 0 else status  # killed by signal N: 128 + N, as shells say


def main(argv):
  command = argv[1:]
  if command[:1] == ["--"]:
    command = command[1:]
  if not command:
    raise SystemExit("No command to launch: put it after `--`, e.g. `python -m "
                     "experiments.launch_local --num_processes=2 -- python -m "
                     "experiments.train_grpo --config=...`.")
  sys.exit(launch_all(command, _NUM.value, _DEVICES.value, _GRACE_S.value))


if __name__ == "__main__":
  launch.run(main)
