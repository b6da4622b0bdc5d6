"""The gloo groups cadence makes for itself (control messages, DCP's background writes) live
exactly as long as the job's process group: ``dist.destroy_process_group()`` -- the user's own
call, not only cadence's `shutdown` -- destroys them. A reference kept by cadence would keep the
group's worker threads running into interpreter exit, where one that drops a finished
collective's tensor needs the GIL, and the rank aborts after a run that went well ("terminate
called without an active exception")."""

import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch.distributed as dist

from cadence.engine.runtime import GlooGroup, control_group


@pytest.fixture
def group_of_one():
    """A gloo process group of one in this process, as a user's script makes it."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")

    def start():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)

    start()
    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_group_cadence_made_is_destroyed_with_the_users_process_group(group_of_one):
    groups = GlooGroup()
    group = groups.get()
    assert groups.get() is group  # made once, on first use
    made = weakref.ref(group)
    del group
    dist.destroy_process_group()  # the user's call
    gc.collect()
    assert made() is None

    group_of_one()  # a new job in the same process gets a group of its own
    assert groups.get() is not None and groups.get() is not made()


def test_under_gloo_the_control_group_is_the_world_looked_up_never_kept(group_of_one):
    world = weakref.ref(control_group())
    assert world() is dist.group.WORLD
    dist.destroy_process_group()
    gc.collect()
    assert world() is None


SCRIPT = """
import os, sys
import cadence.engine.distributed  # a script imports cadence, then makes its group
import torch
import torch.distributed as dist

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.Adam(model.parameters())  # imports torch._dynamo, torch.distributed.nn
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
threads = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(sorted(name for name in threads if "gloo" in name))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_destroy_process_group_joins_gloos_threads_also_after_an_optimizer_was_made():
    """An optimizer made after ``init_process_group`` imports ``torch.distributed.nn``, whose
    functions take the default group as default arguments; imported then, they would keep it,
    and its gloo threads, alive past ``destroy_process_group`` into interpreter exit."""
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                            timeout=120, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
