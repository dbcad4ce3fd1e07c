"""A compiled function that reads a value on the host (`.item()`): dynamo breaks
the graph there and runs the read eagerly, a synchronisation on CUDA. One rank,
gloo, 8 optimizer steps, backend aot_eager (no C++ toolchain needed)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(lin.parameters(), lr=0.01)

    @torch.compile(backend="aot_eager")
    def loss_of(x):
        y = lin(x).relu()
        if y.sum().item() > 0:  # the graph break that synchronises
            y = y * 2
        return y.square().mean()

    for _ in range(8):
        loss_of(torch.randn(8, 16)).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
