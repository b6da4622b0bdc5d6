"""Orbit front-end: Controller + StandardTrainer with its defaults on."""

DESCRIPTION = ("cadence Controller + StandardTrainer: loss metric, summaries every 100 steps, "
               "async checkpoints every 1,000, progress bar")


def build(x, y, workdir, extra_callbacks=()):
    import torch.nn.functional as F
    from workload import TOTAL_STEPS, full_loss, make_loader, make_model, make_sgd

    import cadence

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
            self.loss.update(loss)

        def train_loop_end(self):
            return {"loss": self.loss.result()}

    trainer = Classifier()
    manager = cadence.CheckpointManager(trainer, f"{workdir}/ckpt", checkpoint_interval=1000,
                                        async_save=True)
    controller = cadence.Controller(trainer=trainer, steps_per_loop=100,
                                    summary_dir=f"{workdir}/train", summary_interval=100,
                                    checkpoint_manager=manager,
                                    callbacks=[cadence.ProgressBar(), *extra_callbacks])

    def train():
        controller.train(TOTAL_STEPS)
        manager.wait()

    return train, lambda: full_loss(trainer.model, x, y)
