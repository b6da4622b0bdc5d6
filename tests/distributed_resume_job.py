"""Run under torchrun (gloo): data-parallel training whose ranks must agree -- on when to stop,
on what they save, and on where the rest of a pass goes after a resume.

    job.py train DIR STEPS [RANK:STEP ...]           train to STEPS (SIGTERM to RANK at STEP)
    job.py epoch DIR                                 train to the end of the running pass
    job.py trials DIR N                              N runs, each SIGTERMed at random steps
    job.py late DIR                                  SIGTERM to rank 1 while it waits for rank 0
                                                     in the agreement after the first loop
    job.py trainloop-late DIR                        the same in a TrainLoop, at the first epoch's
                                                     end
    job.py stuck DIR                                 rank 1 stops itself (SIGSTOP) at step 3
    job.py rundir DIR                                run_experiment in DIR/node-<rank>
    job.py flow DIR [STEP]                           TrainLoop on a sharded DataFlow, 2 epochs
                                                     (SIGTERM to rank 1 at STEP, then resumed)
    job.py modes DIR MODE ...                        independent modes (no arguments of their
                                                     own) one after the other, in DIR/<mode>:
                                                     one launch instead of one each

Every rank writes what it saw to DIR/<mode>-<rank>.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import cadence
from cadence.engine.runtime import init_distributed, is_distributed
from cadence.engine.state_file import read_state, write_state

N = int(os.environ.get("CADENCE_TEST_EXAMPLES", "48"))  # 6 batches a rank with 2, 12 with 1
BATCH = 4
DROP_LAST = os.environ.get("CADENCE_TEST_DROP_LAST") == "1"
LOADER = os.environ.get("CADENCE_TEST_LOADER", "map")  # "stateful": torchdata's, own state


class Indexed(cadence.StandardTrainer):
    """A data-parallel regression that records the index of every example it trains on."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(N, 4, generator=generator)
        dataset = TensorDataset(torch.arange(N), x, x.sum(1, keepdim=True))
        world = dist.get_world_size() if is_distributed() else 1
        rank = dist.get_rank() if is_distributed() else 0
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                     seed=7)
        if LOADER == "stateful":
            from torchdata.stateful_dataloader import StatefulDataLoader

            loader: DataLoader = StatefulDataLoader(dataset, batch_size=BATCH, sampler=sampler,
                                                    drop_last=DROP_LAST)
        else:
            loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, drop_last=DROP_LAST)
        super().__init__(loader)
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.2), nn.Linear(8, 1))
        self._ddp = (nn.parallel.DistributedDataParallel(self.model) if is_distributed()
                     else self.model)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.seen: list[int] = []

    def train_step(self, iterator):
        index, x, y = next(iterator)
        self.seen.extend(index.tolist())
        loss = nn.functional.mse_loss(self._ddp(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()


class NoDigestsIO:
    """A custom `CheckpointIO` that returns no digests: it writes its payload as a state file of
    its own name, and the commit has to hash it."""

    filename = "payload.cadence"

    def save(self, payload, directory):
        write_state(payload, directory / self.filename)  # returns the digest: not passed on

    def load(self, directory):
        return read_state(directory / self.filename)


class Kill(cadence.Callback):
    """Sends `signum` to this process after global step `step`."""

    def __init__(self, step: int, signum: int = signal.SIGTERM) -> None:
        self.step, self.signum = step, signum

    def on_step_end(self, state):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class LateAgreement(cadence.Callback):
    """At the end of the loop (or, with ``at="epoch"``, the epoch) that ends at global step
    `step`: rank 0 takes `delay` seconds before it agrees on the stop; rank 1 gets SIGTERM
    `signal_after` seconds in, while it waits in that agreement -- its handler runs the moment
    the collective returns "no rank asked to stop"."""

    def __init__(self, rank: int, step: int, at: str = "loop", delay: float = 2.0,
                 signal_after: float = 0.5) -> None:
        self.rank, self.step, self.at = rank, step, at
        self.delay, self.signal_after = delay, signal_after

    def _late(self, state) -> None:
        if state.global_step != self.step:
            return
        if self.rank == 0:
            time.sleep(self.delay)
        else:
            threading.Timer(self.signal_after, os.kill, (os.getpid(), signal.SIGTERM)).start()

    def on_loop_end(self, state, logs):
        if self.at == "loop":
            self._late(state)

    def on_epoch_end(self, state):
        if self.at == "epoch":
            self._late(state)


def controller(directory: Path, callbacks=()) -> tuple[Indexed, cadence.Controller]:
    trainer = Indexed()
    manager = cadence.CheckpointManager(trainer, directory / "ckpt", checkpoint_interval=5,
                                        max_to_keep=None)
    return trainer, cadence.Controller(trainer=trainer, steps_per_loop=4,
                                       checkpoint_manager=manager, callbacks=callbacks)


def train_loop_until_stopped(directory: Path, callbacks) -> dict[str, int | None]:
    """A TrainLoop of 3 epochs of 6 steps, checkpointed in DIR/ckpt: its exit code and step."""
    model = nn.Linear(4, 1)
    batches = [(torch.randn(8, 4), torch.randn(8, 1)) for _ in range(6)]
    code, step = 0, None
    try:
        with cadence.TrainLoop(model, max_epoch=3, checkpoint_dir=directory / "ckpt",
                               callbacks=callbacks, print_func=lambda line: None) as loop:
            for _ in loop.iter_epochs():
                for _ in loop.iter_steps(batches):
                    pass
                step = loop.step
    except cadence.Preempted as stopped:
        code, step = stopped.code, loop.step
    return {"code": code, "step": step}


def record(directory: Path, mode: str, **values) -> None:
    rank = dist.get_rank() if is_distributed() else 0
    (directory / f"{mode}-{rank}.json").write_text(json.dumps(values))


def main() -> None:
    mode, directory = sys.argv[1], Path(sys.argv[2])
    timeout = 5.0 if mode == "stuck" else 60.0
    init_distributed(timeout)
    if mode == "modes":  # independent modes in one job (one launch), each in DIR/<mode>
        for each in sys.argv[3:]:
            (directory / each).mkdir(parents=True, exist_ok=True)
            run(each, directory / each, [])
            if is_distributed():
                dist.barrier()
    else:
        run(mode, directory, sys.argv[3:])
    if is_distributed():
        dist.barrier()


def run(mode: str, directory: Path, args: list[str]) -> None:
    rank = dist.get_rank() if is_distributed() else 0
    if mode == "train":
        steps = int(args[0])
        kills = dict(item.split(":") for item in args[1:])
        callbacks = [Kill(int(kills[str(rank)]))] if str(rank) in kills else []
        trainer, run = controller(directory, callbacks)
        code = 0
        try:
            run.train(steps)
        except cadence.Preempted as stopped:
            code = stopped.code
        torch.save(trainer.model.state_dict(), directory / f"weights-{rank}.pt")
        record(directory, "train", step=trainer.global_step, seen=trainer.seen, code=code)
    elif mode == "elastic":  # rank 1 is SIGKILLed at step 12 in torchrun's first round only
        first_round = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
        callbacks = [Kill(12, signal.SIGKILL)] if first_round and rank == 1 else []
        trainer, run = controller(directory, callbacks)
        run.train(30)
        record(directory, "elastic", step=trainer.global_step,
               restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))
    elif mode == "lazygroup":  # cadence's own gloo groups connect pairs on first use
        from cadence.engine.runtime import GlooGroup

        def sockets() -> int:
            count = 0
            for fd in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):  # the listing's own fd is gone
                    count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
            return count

        before = sockets()
        group = GlooGroup().get()
        created = sockets() - before
        # No rank starts the all-reduce until every rank has counted: a neighbour ahead would
        # otherwise connect to a rank still counting, and its socket would count as created.
        dist.barrier()
        flag = torch.ones(1)
        dist.all_reduce(flag, group=group)  # a ring: each rank meets its neighbours
        record(directory, mode, created=created, after_all_reduce=sockets() - before,
               world=dist.get_world_size(), sum=flag.item())
    elif mode == "nodigests":  # a CheckpointIO that returns no digests, at 2 ranks
        trainer = Indexed()
        manager = cadence.CheckpointManager(trainer, directory / "ckpt", io=NoDigestsIO())
        path = Path(manager.save(3))
        restored = cadence.CheckpointManager(trainer, directory / "ckpt",
                                             io=NoDigestsIO()).restore(path)
        record(directory, mode, restored=restored,
               manifest=json.loads((path / "manifest.json").read_text()))
    elif mode == "late":
        trainer, run = controller(directory, [LateAgreement(rank, step=4)])
        code = 0
        try:
            run.train(20)
        except cadence.Preempted as stopped:
            code = stopped.code
        record(directory, "late", step=trainer.global_step, code=code)
    elif mode == "epoch":
        trainer, run = controller(directory)
        run.train(epochs=1)
        record(directory, "epoch", step=trainer.global_step, seen=trainer.seen)
    elif mode == "trials":
        results = []
        for trial in range(int(args[0])):
            rng = random.Random(trial * 10 + rank)
            trainer, run = controller(directory / f"trial-{trial}", [Kill(rng.randint(2, 9))])
            try:
                run.train(40)
                results.append({"trial": trial, "preempted": None})
            except cadence.Preempted as stopped:
                results.append({"trial": trial, "preempted": stopped.checkpoint,
                                "code": stopped.code, "step": trainer.global_step})
        record(directory, "trials", results=results)
    elif mode == "stuck":
        signum = signal.SIGSTOP if rank == 1 else signal.SIGUSR1
        trainer, run = controller(directory, [Kill(3, signum)] if rank == 1 else [])
        run.train(40)  # rank 0 waits for rank 1 in a collective, until the timeout
    elif mode == "tensorpack":  # each rank its own shard of the data: replicas stay equal
        from cadence.tensorpack import SimpleTrainer

        torch.manual_seed(rank)  # different initial weights: rank 0's must win
        model = nn.Linear(4, 1)
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(rank))
        data = [(x[i:i + 8], x[i:i + 8].sum(1, keepdim=True)) for i in range(0, 32, 8)]
        trainer = SimpleTrainer()
        trainer.setup_graph(data, lambda a, b: nn.functional.mse_loss(model(a), b),
                            lambda params: torch.optim.SGD(params, lr=0.1), model=model)
        trainer.train(steps_per_epoch=4, max_epoch=2)
        torch.save(model.state_dict(), directory / f"tensorpack-{rank}.pt")
    elif mode in ("trainloop", "trainloop-late"):
        # trainloop: SIGTERM to rank 1 only, every rank saves the same step; trainloop-late:
        # SIGTERM to rank 1 while it waits in the agreement after the first epoch (6 steps)
        callbacks = ([LateAgreement(rank, step=6, at="epoch")] if mode == "trainloop-late"
                     else [Kill(5)] if rank == 1 else [])
        record(directory, mode, **train_loop_until_stopped(directory, callbacks))
    elif mode == "flow":  # each rank its share of a shuffled DataFlow, resumed mid-epoch
        kill = int(args[0]) if args else None
        flow = cadence.DataFlow.arrays([torch.arange(21)], batch_size=3, shuffle=True,
                                       random_state=5).shard()
        seen: list[list[int]] = []
        for attempt in range(2):
            try:
                with cadence.TrainLoop(nn.Linear(1, 1), max_epoch=2,
                                       checkpoint_dir=directory / "ckpt",
                                       callbacks=[Kill(kill)] if rank == 1 and kill and
                                       attempt == 0 else [],
                                       checkpoint_save_objects={"flow": flow},
                                       print_func=lambda line: None) as loop:
                    for _ in loop.iter_epochs():
                        for _, (index,) in loop.iter_steps(flow):
                            seen.append(index.tolist())
                break
            except cadence.Preempted:
                continue
        record(directory, "flow", seen=seen, batches=len(flow))
    elif mode in ("dcpasync", "ddpasync"):  # written in a background thread, committed later
        from cadence.task.registry import get_task
        from cadence.task.train_lib import create_trainer

        strategy = "fsdp2" if mode == "dcpasync" else "ddp"
        config = cadence.load_config("digits", overrides=[
            "task.model.hidden_sizes=[32]", f"runtime.strategy={strategy}"])
        trainer = create_trainer(config, get_task(config.task), train=True, evaluate=False)
        manager = cadence.CheckpointManager(trainer, directory / "ckpt", async_save=True)
        path = Path(manager.save(1))
        committed_early = path.is_dir()
        pending = manager.writer.pending_commit is not None
        expected = {name: value.clone() for name, value in trainer.model.state_dict().items()}
        with torch.no_grad():  # the weights change while the write is under way
            for parameter in trainer.model.parameters():
                parameter.add_(1.0)
        manager.wait()  # every rank: the write is done, rank 0 commits
        restored = cadence.CheckpointManager(trainer, directory / "ckpt").restore(path)
        same = all(torch.equal(trainer.model.state_dict()[name], value)
                   for name, value in expected.items())
        # Retention: rank 0 deletes old checkpoints in a thread of its own; wait() joins it.
        from cadence.core.checkpoint_dir import CheckpointDirectory

        pruners: list[str] = []
        prune, gate = CheckpointDirectory.prune, threading.Event()
        gate.set()
        CheckpointDirectory.prune = lambda self: (  # type: ignore[method-assign]
            pruners.append(threading.current_thread().name) or (gate.wait(60) and prune(self)))
        kept = cadence.CheckpointManager(trainer, directory / "kept", max_to_keep=2,
                                         async_save=True)
        for step in (1, 2):
            kept.save(step)
        kept.wait()
        gate.clear()  # rank 0's next prune takes its time
        kept.save(3)
        kept.wait(retention=False)  # a loop's end: the commit, not the deletes
        while_pruning = sorted(p.name for p in (directory / "kept").iterdir())
        gate.set()
        kept.wait()
        CheckpointDirectory.prune = prune  # type: ignore[method-assign]  # for the next mode
        record(directory, mode, pending=pending, pruners=pruners, while_pruning=while_pruning,
               kept=sorted(p.name for p in (directory / "kept").iterdir()),
               committed_early=committed_early, committed=path.is_dir(), restored=restored,
               saved_weights_restored=same, files=sorted(p.name for p in path.iterdir()),
               shards=sorted(p.name for p in (path / "sharded").iterdir())
               if (path / "sharded").is_dir() else [])
    elif mode in ("fsdp2", "fsdp2restore"):  # sharded training and DCP checkpoints
        from cadence.engine.sharded import full_model_state
        from cadence.task.registry import get_task
        from cadence.task.train_lib import create_trainer

        strategy = "fsdp2" if is_distributed() else "none"
        config = cadence.load_config("digits", overrides=[
            "trainer.train_steps=20", "trainer.steps_per_loop=10",
            "trainer.checkpoint_interval=10", "trainer.validation_interval=10",
            "task.model.hidden_sizes=[32]", f"runtime.strategy={strategy}",
            "trainer.optimizer_config.learning_rate.warmup_steps=0"])
        world = dist.get_world_size() if is_distributed() else 1
        if mode == "fsdp2":
            model, logs = cadence.run_experiment(config, "train_and_eval", directory / "run")
            name, extra = "full.pt", {"accuracy": logs["accuracy"]}
        else:
            trainer = create_trainer(config, get_task(config.task), train=True, evaluate=False)
            manager = cadence.CheckpointManager(trainer, directory / "run" / "checkpoints")
            manager.restore_or_initialize()
            model, name = trainer.model, f"restored-{world}.pt"
            extra = {"step": trainer.global_step}
        state = full_model_state(model)  # a collective: every rank gathers
        if rank == 0:
            torch.save(state, directory / name)
        record(directory, mode, **extra)
    elif mode == "rundir":
        config = cadence.load_config("digits", overrides=["trainer.train_steps=4",
                                                          "trainer.steps_per_loop=2"])
        cadence.run_experiment(config, "train", directory / f"node-{rank}")


if __name__ == "__main__":
    main()
