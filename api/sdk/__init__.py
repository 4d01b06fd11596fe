"""The client SDKs this server hands out under `/sdk/`, built in memory from its own sources."""
