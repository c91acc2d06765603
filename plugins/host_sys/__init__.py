"""host_sys: the host CPU, memory, disk and network while the job runs (being built)."""
