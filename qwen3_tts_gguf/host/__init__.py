"""Where and how much to compute: CPUs and threads, devices and their locks, the heap."""
