"""Built-in workloads: one module per workload, each defining ``WORKLOAD``."""
