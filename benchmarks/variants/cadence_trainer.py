"""Task front-end: Trainer(config, task, model, optimizer) driven by a Controller."""

DESCRIPTION = ("cadence Task Trainer with its defaults: training-loss metric, summaries every 100 "
               "steps, async checkpoints every 1,000, progress bar, the run's timeline and "
               "goodput (as run_experiment records them)")

DEFAULTS = ("summaries", "checkpoints", "progress", "timeline", "controller")
"""What ``build(without=...)`` can leave out, one at a time (``benchmarks/paired.py
--ablation``): the summaries, the checkpoints, the progress bar, the run's timeline, and the
Controller itself (the Trainer's ``train(100)`` called in a plain loop, with none of them). The
training-loss metric is the Trainer's own: it stays."""


def build(x, y, workdir, metrics=None, without=()):
    import torch.nn.functional as F
    from workload import TOTAL_STEPS, full_loss, make_loader, make_model, make_sgd

    import cadence
    from cadence.records.run_record import RunRecord

    class Task(cadence.Task):
        def build_inputs(self, params, input_context=None):
            return make_loader(x, y)

        def build_losses(self, labels, model_outputs, aux_losses=None):
            return F.cross_entropy(model_outputs, labels)

        def build_metrics(self, training=True):
            return {name: make() for name, make in (metrics or {}).items()}

    config = cadence.load_config(cadence.ExperimentConfig(), overrides=[
        f"trainer.train_steps={TOTAL_STEPS}", "trainer.steps_per_loop=100",
        "trainer.summary_interval=100", "trainer.checkpoint_interval=1000",
        "runtime.device=cpu"])  # the raw loop's device, also where CUDA is visible
    task = Task(config.task)
    model = make_model()
    trainer = cadence.Trainer(config, task, model, make_sgd(model), evaluate=False)
    manager = (None if "checkpoints" in without else
               cadence.CheckpointManager(trainer, f"{workdir}/ckpt", checkpoint_interval=1000,
                                         async_save=True))
    # run_experiment's timeline (its directory is made here: not without the Controller)
    record = None if {"timeline", "controller"} & set(without) else RunRecord(workdir)
    if manager is not None and record is not None:
        manager.on_commit = record.timeline.commit  # a line per loop, goodput
    summaries = {} if "summaries" in without else {"summary_dir": f"{workdir}/train",
                                                   "summary_interval": 100}
    progress = [] if "progress" in without else [cadence.ProgressBar()]
    controller = cadence.Controller(trainer=trainer, steps_per_loop=100,
                                    checkpoint_manager=manager, **summaries,
                                    callbacks=progress, record=record)

    def train():
        if "controller" in without:
            for done in range(0, TOTAL_STEPS, 100):
                trainer.train(min(100, TOTAL_STEPS - done))
            return
        if record is not None:
            record.timeline.start(1)
        controller.train(TOTAL_STEPS)
        if manager is not None:
            manager.wait()
        if record is not None:
            record.timeline.end("finished", TOTAL_STEPS)

    return train, lambda: full_loss(model, x, y)
