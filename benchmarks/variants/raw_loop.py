"""A hand-written PyTorch loop over the DataLoader: the baseline."""

DESCRIPTION = "raw PyTorch loop over the DataLoader (baseline)"


def build(x, y, workdir):
    import torch.nn.functional as F
    from workload import EPOCHS, full_loss, make_loader, make_model, make_sgd

    model, loader = make_model(), make_loader(x, y)
    optimizer = make_sgd(model)

    def train():
        for _ in range(EPOCHS):
            for xb, yb in loader:
                optimizer.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                optimizer.step()

    return train, lambda: full_loss(model, x, y)
