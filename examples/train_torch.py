"""Train a small CNN whose max pooling, activation and adaptive pooling are symgrad ops.

The pooling splits the gradient of a tied window evenly (ties="split"), a choice PyTorch's own
max_pool2d does not offer; the inputs are small integers, so ties are everywhere.  Prints the
loss every 20 steps: it falls.  Run: python examples/train_torch.py
"""

import torch

import symgrad.torch as st


def main(steps: int = 100) -> list[float]:
    torch.manual_seed(0)
    x = torch.randint(0, 4, (64, 1, 12, 12)).float()  # synthetic images with many ties
    y = (x[:, 0, :6].sum((1, 2)) > x[:, 0, 6:].sum((1, 2))).long()  # brighter top half?
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), st.ReLU(),
        st.MaxPool2d(2, ties="split"), torch.nn.Conv2d(8, 8, 3, padding=1), st.LeakyReLU(0.1),
        st.AdaptiveMaxPool2d((2, 1), ties="split"), torch.nn.Flatten(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps + 1):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 20 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}")
    return losses


if __name__ == "__main__":
    main()
