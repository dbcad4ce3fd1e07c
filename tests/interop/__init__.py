"""Other tools and stacks: Kineto, Nsight and Flight Recorder files in, NVTX out, profilers,
torch.compile, FSDP2 / DTensor / pipelining jobs."""
