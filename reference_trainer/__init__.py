"""A small hybrid-parallel (DP x TP x PP) GPT trainer, instrumented with `collectors`.

Run it under torchrun:

    torchrun --standalone --nproc-per-node 4 -m reference_trainer --dp 2 --pp 2 --steps 20

It is the workload `diagnose demo` runs; `--fault` injects the problems the
analyzer must find (see faults.py and scenarios.py). It imports nothing but
torch, numpy and `collectors`.
"""
