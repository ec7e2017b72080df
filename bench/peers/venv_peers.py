"""The peers that run in virtualenvs of their own (.peers/, made by `make peers`): Sample Factory and RLlib.

Each run is a subprocess of its venv's python running the peer's runner script (bench/peers/*_runner.py),
handed the launch time so its clock starts with the command (start-up included); its last stdout line is
one JSON object (bench/peers/greedy_eval.py: seed, solved, wall_s, env_steps, env_steps_per_s, evaluations).
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = ROOT / ".peers"


class PeerError(RuntimeError):
    """A peer could not run: its venv is missing, or its runner failed or printed no result."""


@dataclass(frozen=True)
class VenvPeer:
    venv: str  # the folder under .peers/
    runner: str  # the runner script, relative to the repository root
    algos: dict[str, str]  # time_to_solve's --algo -> the peer's algorithm that races it

    def python(self, peers_dir: Path = PEERS_DIR) -> Path:
        return peers_dir / self.venv / "bin" / "python"


VENV_PEERS = {
    "sample-factory": VenvPeer("sample-factory", "bench/peers/sample_factory_runner.py", {"ppo": "APPO"}),
    "rllib": VenvPeer("rllib", "bench/peers/rllib_runner.py", {"ppo": "PPO", "dqn": "DQN"}),
}
PEERS = ("sb3", *VENV_PEERS)


def parse_peers(text: str) -> list[str]:
    """``--peer`` (comma-separated) as a list, in the order given, each once; a clear error for an unknown name."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in PEERS]
    if unknown or not names:
        raise ValueError(f"--peer {text!r}: unknown peer {', '.join(unknown) or '(none given)'}; "
                         f"allowed: {', '.join(PEERS)}, comma-separated")
    return list(dict.fromkeys(names))


def check_peer(name: str, algo: str, peers_dir: Path = PEERS_DIR) -> None:
    """Refuse before any run: a peer that does not race ``algo``, or whose venv `make peers` has not built."""
    peer = VENV_PEERS[name]
    if algo not in peer.algos:
        raise PeerError(f"--peer {name} races --algo {', '.join(peer.algos)}, not {algo}")
    if not peer.python(peers_dir).exists():
        raise PeerError(f"--peer {name}: no {peer.python(peers_dir)}; run `make peers` first")


def run_venv_peer(name: str, algo: str, env_id: str, seed: int, budget: int, eval_every: int,
                  target: float | None, timeout_s: float | None = None, peers_dir: Path = PEERS_DIR
                  ) -> dict[str, Any]:
    """One run of peer ``name`` in its venv: its result, ``peer_algo`` added."""
    check_peer(name, algo, peers_dir)
    peer = VENV_PEERS[name]
    start = time.time()
    cmd = [str(peer.python(peers_dir)), str(ROOT / peer.runner), "--algo", peer.algos[algo], "--env", env_id,
           "--seed", str(seed), "--budget", str(budget), "--eval-every", str(eval_every),
           "--start-epoch", repr(start)]
    cmd += ["--target", str(target)] if target is not None else []
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise PeerError(f"{name} seed {seed}: no result after {timeout_s} s") from exc
    result = last_json(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise PeerError(f"{name} seed {seed}: runner exited {proc.returncode} without a result; "
                        f"its stderr ends:\n{proc.stderr[-3000:]}")
    return {**result, "peer_algo": peer.algos[algo]}


def last_json(stdout: str) -> dict[str, Any] | None:
    """The last line of ``stdout`` that is a JSON object (libraries print their own lines before it)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


PIXELS_RUNNER = "bench/peers/sample_factory_atari_runner.py"  # Sample Factory APPO on Pong: env frames/s


def run_pixels_peer(workers: int, seconds: float, envs_per_worker: int | None = None,
                    peers_dir: Path = PEERS_DIR) -> dict[str, Any]:
    """Sample Factory APPO's env frames/s on Pong with ``workers`` rollout workers for ``seconds`` (its tuned
    Atari example; ``envs_per_worker``: its throughput settings), in its venv: the runner's result."""
    check_peer("sample-factory", "ppo", peers_dir)
    cmd = [str(VENV_PEERS["sample-factory"].python(peers_dir)), str(ROOT / PIXELS_RUNNER), "--workers", str(workers),
           "--seconds", str(seconds)]
    cmd += ["--envs-per-worker", str(envs_per_worker)] if envs_per_worker is not None else []
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=seconds + 300,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise PeerError(f"sample-factory pixels, {workers} workers: no result after {seconds + 300:g} s") from exc
    result = last_json(proc.stdout)
    if proc.returncode != 0 or result is None or result.get("frames_per_s") is None:
        raise PeerError(f"sample-factory pixels, {workers} workers: runner exited {proc.returncode} without a "
                        f"figure; its stderr ends:\n{proc.stderr[-3000:]}")
    return result
