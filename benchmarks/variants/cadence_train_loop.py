"""tfsnippet front-end: TrainLoop with collect_metrics every step."""

DESCRIPTION = ("cadence TrainLoop: collect_metrics(loss) every step, a log line and summaries "
               "per epoch, a checkpoint per epoch (built outside the timed call, entered in it)")


def build(x, y, workdir):
    import torch.nn.functional as F
    from workload import EPOCHS, full_loss, make_loader, make_model, make_sgd

    import cadence

    model, loader = make_model(), make_loader(x, y)
    optimizer = make_sgd(model)

    loop = cadence.TrainLoop(model, max_epoch=EPOCHS, checkpoint_dir=f"{workdir}/ckpt",
                             checkpoint_epoch_freq=1, summary_dir=f"{workdir}/train",
                             checkpoint_save_objects={"optimizer": optimizer},
                             print_func=lambda line: None)

    def train():
        with loop:
            for _ in loop.iter_epochs():
                for _, (xb, yb) in loop.iter_steps(loader):
                    optimizer.zero_grad(set_to_none=True)
                    loss = F.cross_entropy(model(xb), yb)
                    loss.backward()
                    optimizer.step()
                    loop.collect_metrics(loss=loss)
                loop.print_logs()

    return train, lambda: full_loss(model, x, y)
