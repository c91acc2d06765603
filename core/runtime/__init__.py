"""What runs inside the profiled job: start-up, the session, the sink thread, step detection,
the storage budget, and the wait for torch.  Offline code (analysis, cli) never imports it."""
