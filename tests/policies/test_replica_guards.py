"""Replica safety pieces: one deep copy keeps the processors' links, and ``CaptureLock`` keeps CUDA
graph captures away from other replicas' calls without deadlocking replicas that capture at once."""

from __future__ import annotations

import threading
import time
from typing import Any

from cosmos_robot.policies.cuda_graphs import CaptureLock
from cosmos_robot.policies.replicas import Replicable


class Step:
    def __init__(self) -> None:
        self.saved: Any = None


class Post:
    def __init__(self, pack: Step) -> None:
        self.pack = pack  # as LeRobot's GR00T decode step reads its preprocessor's pack step


class Linked(Replicable):
    def __init__(self) -> None:
        self.preprocessor = Step()
        self.postprocessor = Post(self.preprocessor)
        self.tokenizer = None
        self.renewed = 0
        self.device = "cpu"

    def renew_graph_caches(self) -> None:
        self.renewed += 1


def test_replica_copies_linked_processors_together() -> None:
    policy = Linked()
    twin = policy.replica()
    assert twin.preprocessor is not policy.preprocessor
    assert twin.postprocessor.pack is twin.preprocessor  # still linked, to its own copy
    assert policy.postprocessor.pack is policy.preprocessor and twin.renewed == 1 and policy.renewed == 0


def test_capture_waits_for_other_calls_and_blocks_new_ones() -> None:
    lock, events = CaptureLock(), []
    inside = threading.Event()

    def call() -> None:
        with lock.shared():
            inside.set()
            time.sleep(0.2)
            events.append("call done")

    def capture() -> None:
        inside.wait()
        with lock.exclusive():
            events.append("capture")

    threads = [threading.Thread(target=call), threading.Thread(target=capture)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert events == ["call done", "capture"]


def test_two_replicas_capturing_inside_their_calls_do_not_deadlock() -> None:
    lock, done = CaptureLock(), []
    both_inside = threading.Barrier(2)

    def replica(name: str) -> None:
        with lock.shared():
            both_inside.wait(timeout=5)
            with lock.exclusive():  # a new shape mid-call, on both replicas at once
                time.sleep(0.05)
                done.append(name)

    threads = [threading.Thread(target=replica, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=5)
    assert sorted(done) == ["a", "b"] and not any(t.is_alive() for t in threads)
