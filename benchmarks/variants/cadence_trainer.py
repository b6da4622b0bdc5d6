"""Task front-end: Trainer(config, task, model, optimizer) driven by a Controller."""

DESCRIPTION = ("cadence Task Trainer with its defaults: training-loss metric, summaries every 100 "
               "steps, async checkpoints every 1,000, progress bar, the run's timeline and "
               "goodput (as run_experiment records them)")


def build(x, y, workdir, metrics=None):
    import torch.nn.functional as F
    from workload import TOTAL_STEPS, full_loss, make_loader, make_model, make_sgd

    import cadence
    from cadence.core.run_record import RunRecord

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
    manager = cadence.CheckpointManager(trainer, f"{workdir}/ckpt", checkpoint_interval=1000,
                                        async_save=True)
    record = RunRecord(workdir)  # run_experiment's timeline: a line per loop, goodput
    manager.on_commit = record.timeline.commit
    controller = cadence.Controller(trainer=trainer, steps_per_loop=100,
                                    summary_dir=f"{workdir}/train", summary_interval=100,
                                    checkpoint_manager=manager,
                                    callbacks=[cadence.ProgressBar()], record=record)

    def train():
        record.timeline.start(1)
        controller.train(TOTAL_STEPS)
        manager.wait()
        record.timeline.end("finished", TOTAL_STEPS)

    return train, lambda: full_loss(model, x, y)
