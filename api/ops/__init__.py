"""Running a shared server: middleware, hosts, clients, connections, lifecycle and drain, logs, metrics, headers."""
