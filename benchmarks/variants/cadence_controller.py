"""Orbit front-end: Controller + StandardTrainer with its defaults on."""

DESCRIPTION = ("cadence Controller + StandardTrainer: loss metric, summaries every 100 steps, "
               "async checkpoints every 1,000, progress bar")

DEFAULTS = ("loss", "summaries", "checkpoints", "progress", "controller")
"""What ``build(without=...)`` can leave out, one at a time (``benchmarks/paired.py
--ablation``): the loss metric, the summaries, the checkpoints, the progress bar, and the
Controller itself (the trainer's ``train(100)`` called in a plain loop, with none of them)."""


def build(x, y, workdir, extra_callbacks=(), without=()):
    import torch.nn.functional as F
    from workload import TOTAL_STEPS, full_loss, make_loader, make_model, make_sgd

    import cadence

    keeps_loss = "loss" not in without

    class Classifier(cadence.StandardTrainer):
        def __init__(self):
            super().__init__(make_loader(x, y))
            self.model = make_model()
            self.optimizer = make_sgd(self.model)
            self.loss = cadence.Mean()

        def train_loop_begin(self):
            self.loss.reset()

        def train_step(self, iterator):
            xb, yb = next(iterator)
            self.optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(self.model(xb), yb)
            loss.backward()
            self.optimizer.step()
            if keeps_loss:
                self.loss.update(loss)

        def train_loop_end(self):
            return {"loss": self.loss.result()}

    trainer = Classifier()
    manager = (None if "checkpoints" in without else
               cadence.CheckpointManager(trainer, f"{workdir}/ckpt", checkpoint_interval=1000,
                                         async_save=True))
    summaries = {} if "summaries" in without else {"summary_dir": f"{workdir}/train",
                                                   "summary_interval": 100}
    progress = [] if "progress" in without else [cadence.ProgressBar()]
    controller = cadence.Controller(trainer=trainer, steps_per_loop=100,
                                    checkpoint_manager=manager, **summaries,
                                    callbacks=[*progress, *extra_callbacks])

    def train():
        if "controller" in without:
            for done in range(0, TOTAL_STEPS, 100):
                trainer.train(min(100, TOTAL_STEPS - done))
            return
        controller.train(TOTAL_STEPS)
        if manager is not None:
            manager.wait()

    return train, lambda: full_loss(trainer.model, x, y)
