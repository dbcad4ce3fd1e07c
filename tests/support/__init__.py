"""What the tests (and bench/) share: launching jobs and reading runs (jobs), written
runs and traces (synthetic_run, async_stream_model, megatron_stream_model,
stream_sim_queues, stream_sim_faults, whatif_sim_cases, kineto_perturb), fakes (fake_pynvml) and a
headless browser (cdp). Imported as tests.support.<module>; no tests here."""
