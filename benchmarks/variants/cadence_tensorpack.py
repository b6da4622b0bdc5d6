"""tensorpack front-end: SimpleTrainer with its default callbacks and monitors."""

DESCRIPTION = ("cadence SimpleTrainer: ModelSaver per epoch, default monitors (TensorBoard, "
               "JSON, printer) and progress bar")


def build(x, y, workdir):
    import torch.nn.functional as F
    from workload import EPOCHS, STEPS_PER_EPOCH, full_loss, make_loader, make_model, make_sgd

    from cadence.callbacks import ModelSaver
    from cadence.tensorpack import SimpleTrainer, cost_from_model

    model = make_model()
    trainer = SimpleTrainer(logdir=workdir)
    trainer.setup_graph(make_loader(x, y), cost_from_model(model, F.cross_entropy),
                        lambda: make_sgd(model), model=model)

    def train():
        trainer.train_with_defaults(callbacks=[ModelSaver()], steps_per_epoch=STEPS_PER_EPOCH,
                                    max_epoch=EPOCHS)

    return train, lambda: full_loss(model, x, y)
