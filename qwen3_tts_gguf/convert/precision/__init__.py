"""Which layers a reduced precision may take: activation ranges measured on a checkpoint's own weights."""
