"""Two attempts writing the same store at once: the newer always wins, the older is rejected.

The zombie is a real process (the kill test's writer, saving as fast as it can); the race between
a zombie's fence check and its manifest PUT is also forced deterministically, and run many times
with threads at random moments."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from airflow_gpu.checkpoint import Checkpointer, StaleAttemptError

KILL_TEST = Path(__file__).with_name("test_checkpoint_kill.py")


def writer(uri: str, attempt: int, **kw) -> Checkpointer:
    return Checkpointer(uri, attempt=attempt, handle_sigterm=False, part_size=5 << 20, keep_last=50, **kw)


def test_zombie_process_is_rejected_and_newer_attempt_wins(checkpoint_store_uri):
    import os

    zombie = subprocess.Popen(
        [sys.executable, str(KILL_TEST), "writer", checkpoint_store_uri, "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )
    try:
        committed = []
        for line in zombie.stdout:  # let attempt 1 commit a few checkpoints
            marker, step = line.split()
            if marker == "C":
                committed.append(int(step))
                if len(committed) == 4:
                    break
        newer = writer(checkpoint_store_uri, attempt=2)
        newer.claim()  # the operator started attempt 2: from here attempt 1 cannot commit
        resumed_from = newer.store.latest()
        assert resumed_from.attempt == 1
        mine = newer.save(1, b"attempt 2 restarts from an early step on purpose")
        _, stderr = zombie.communicate(timeout=30)
    finally:
        zombie.kill()
        zombie.wait()
    assert zombie.returncode != 0
    assert "StaleAttemptError: attempt 1 is stale: attempt 2 has claimed checkpoint store" in stderr
    # ordering is (attempt, step): attempt 2's step 1 beats every step attempt 1 ever wrote
    latest = newer.store.latest(verify="checksums")
    assert (latest.attempt, latest.step) == (2, 1) and latest.key == mine.key
    stale = writer(checkpoint_store_uri, attempt=1)
    with pytest.raises(StaleAttemptError, match=r"attempt 1 is stale: attempt 2 has claimed .* \(at claim\)"):
        stale.save(100, b"zombie")
    assert newer.store.latest().key == mine.key


def test_claim_racing_a_commit_withdraws_the_zombies_manifest(checkpoint_store_uri):
    zombie, newer = writer(checkpoint_store_uri, 1), writer(checkpoint_store_uri, 2)
    zombie.save(1, b"before the newer attempt")
    commit = zombie._commit

    def commit_while_newer_claims(ckpt, body):
        newer.claim()  # lands after the zombie's last check, before its manifest PUT
        commit(ckpt, body)

    zombie._commit = commit_while_newer_claims
    with pytest.raises(StaleAttemptError, match="raced with the claim and was withdrawn"):
        zombie.save(2, b"raced")
    keys = zombie.store.manifest_keys()
    assert [zombie.store.load(k).step for k in keys] == [1]
    assert len(zombie.store.backend.list_dirs("data/")) == 1  # the withdrawn save's data is gone too
    assert newer.resume().data == b"before the newer attempt"


def test_random_races_newer_attempt_always_wins(tmp_path):
    rng = random.Random(7)
    raced = 0
    for round_ in range(25):
        uri = f"file://{tmp_path / str(round_)}"
        old, new = writer(uri, 1, gc_grace_seconds=0), writer(uri, 2)
        old.save(0, b"0")
        outcomes: list[tuple[str, int]] = []
        saving = threading.Event()

        def zombie_loop() -> None:
            for step in range(1, 40):
                try:
                    old.save(step, str(step).encode())
                    outcomes.append(("committed", step))
                    saving.set()
                except StaleAttemptError:
                    outcomes.append(("rejected", step))
                    return

        thread = threading.Thread(target=zombie_loop)
        thread.start()
        # under load a thread can start late: wait for the zombie's first commit, so the claim
        # always lands in the middle of its saves and never before the race began
        assert saving.wait(30)
        time.sleep(rng.uniform(0, 0.01))
        new.claim()
        restored = new.resume()
        new.save(restored.step + 1, b"new")
        thread.join()
        assert outcomes[-1][0] == "rejected", outcomes[-3:]
        # every commit the zombie was told succeeded was visible to the newer attempt's resume
        assert all(step <= restored.step for kind, step in outcomes if kind == "committed"), (outcomes, restored.step)
        latest = new.store.latest(verify="checksums")
        assert (latest.attempt, latest.step) == (2, restored.step + 1)
        raced += restored.checkpoint.attempt == 1 and restored.step > 0
        old.close()
        new.close()
    assert raced >= 10  # the claim really landed while the zombie was saving, most rounds
